package protocol

import "github.com/drover-fleet/drover/internal/protocol/agentv1"

// KindOf returns the kind that e's payload implies, from the oneof that is
// set, or KIND_UNSPECIFIED when none is. Validate requires it to equal
// e.GetKind().
func KindOf(e *agentv1.Envelope) agentv1.Kind {
	switch e.GetPayload().(type) {
	case *agentv1.Envelope_Heartbeat:
		return agentv1.Kind_KIND_HEARTBEAT
	case *agentv1.Envelope_NodeState:
		return agentv1.Kind_KIND_NODE_STATE
	case *agentv1.Envelope_Ack:
		return agentv1.Kind_KIND_ACK
	case *agentv1.Envelope_FullSyncRequest:
		return agentv1.Kind_KIND_FULL_SYNC_REQUEST
	case *agentv1.Envelope_Snapshot:
		return agentv1.Kind_KIND_SNAPSHOT
	case *agentv1.Envelope_Dispatch:
		return agentv1.Kind_KIND_DISPATCH
	case *agentv1.Envelope_Cancel:
		return agentv1.Kind_KIND_CANCEL
	case *agentv1.Envelope_Status:
		return agentv1.Kind_KIND_STATUS
	case *agentv1.Envelope_NodeConfiguration:
		return agentv1.Kind_KIND_NODE_CONFIGURATION
	case *agentv1.Envelope_LogRequest:
		return agentv1.Kind_KIND_LOG_REQUEST
	case *agentv1.Envelope_LogChunk:
		return agentv1.Kind_KIND_LOG_CHUNK
	default:
		return agentv1.Kind_KIND_UNSPECIFIED
	}
}

// payloadName is the proto field name of the oneof member for kind k.
func payloadName(k agentv1.Kind) string {
	switch k {
	case agentv1.Kind_KIND_HEARTBEAT:
		return "heartbeat"
	case agentv1.Kind_KIND_NODE_STATE:
		return "node_state"
	case agentv1.Kind_KIND_ACK:
		return "ack"
	case agentv1.Kind_KIND_FULL_SYNC_REQUEST:
		return "full_sync_request"
	case agentv1.Kind_KIND_SNAPSHOT:
		return "snapshot"
	case agentv1.Kind_KIND_DISPATCH:
		return "dispatch"
	case agentv1.Kind_KIND_CANCEL:
		return "cancel"
	case agentv1.Kind_KIND_STATUS:
		return "status"
	case agentv1.Kind_KIND_NODE_CONFIGURATION:
		return "node_configuration"
	case agentv1.Kind_KIND_LOG_REQUEST:
		return "log_request"
	case agentv1.Kind_KIND_LOG_CHUNK:
		return "log_chunk"
	default:
		return "none"
	}
}

// The constructors below build envelopes with a fresh id (NewID) and the kind
// derived from the payload. They do not validate: Encode does, and tests
// build malformed envelopes on purpose.

// NewHeartbeat builds a heartbeat from node.
func NewHeartbeat(node string) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Payload: &agentv1.Envelope_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}})
}

// NewAck builds an acknowledgement of the envelope whose id is ackOf and
// of the envelopes whose ids are more (see MaxAckIDs).
func NewAck(node, ackOf string, more ...string) *agentv1.Envelope {
	e := seal(&agentv1.Envelope{Node: node, Payload: &agentv1.Envelope_Ack{Ack: &agentv1.Ack{More: more}}})
	e.AckOf = ackOf
	return e
}

// NewFullSyncRequest asks the other side for its whole state; have is the
// last revision the requester applied.
func NewFullSyncRequest(node string, have uint64) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Payload: &agentv1.Envelope_FullSyncRequest{
		FullSyncRequest: &agentv1.FullSyncRequest{HaveRevision: have},
	}})
}

// NewSnapshot builds the hub's full list of node's work at revision rev.
func NewSnapshot(node string, rev uint64, items []*agentv1.WorkItem) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Revision: rev, Payload: &agentv1.Envelope_Snapshot{Snapshot: &agentv1.Snapshot{Items: items}}})
}

// NewDispatch builds the delivery of one work item at revision rev.
func NewDispatch(node string, rev uint64, item *agentv1.WorkItem) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Revision: rev, Payload: &agentv1.Envelope_Dispatch{Dispatch: &agentv1.Dispatch{Item: item}}})
}

// NewDispatches builds one Dispatch of items, which are at consecutive
// revisions from rev (see Dispatch). Only agents that name
// FeatureDispatchBatch may be sent more than one item.
func NewDispatches(node string, rev uint64, items []*agentv1.WorkItem) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Revision: rev, Payload: &agentv1.Envelope_Dispatch{Dispatch: &agentv1.Dispatch{Item: items[0], More: items[1:]}}})
}

// DispatchItems returns the work items of a Dispatch in revision order:
// item, then more.
func DispatchItems(d *agentv1.Dispatch) []*agentv1.WorkItem {
	return append([]*agentv1.WorkItem{d.GetItem()}, d.GetMore()...)
}

// NewCancel builds the cancellation of work uid at revision rev.
func NewCancel(node string, rev uint64, uid string) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Revision: rev, Payload: &agentv1.Envelope_Cancel{Cancel: &agentv1.Cancel{Uid: uid}}})
}

// NewStatus builds the agent's report of one work item's status at the
// agent's revision rev.
func NewStatus(node string, rev uint64, w *agentv1.WorkStatus) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Revision: rev, Payload: &agentv1.Envelope_Status{Status: &agentv1.Status{Work: w}}})
}

// NewStatuses builds one Status envelope of ws, which are at consecutive
// revisions from rev (see Status).
func NewStatuses(node string, rev uint64, ws []*agentv1.WorkStatus) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Revision: rev, Payload: &agentv1.Envelope_Status{Status: &agentv1.Status{Work: ws[0], More: ws[1:]}}})
}

// NewNodeState builds the agent's full state at its revision rev.
func NewNodeState(node string, rev uint64, info *agentv1.NodeInfo, work []*agentv1.WorkStatus) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Revision: rev, Payload: &agentv1.Envelope_NodeState{NodeState: &agentv1.NodeState{Info: info, Work: work}}})
}

// NewNodeConfiguration builds the hub's configuration for node.
func NewNodeConfiguration(node string, cfg *agentv1.NodeConfiguration) *agentv1.Envelope {
	if cfg == nil {
		cfg = &agentv1.NodeConfiguration{}
	}
	return seal(&agentv1.Envelope{Node: node, Payload: &agentv1.Envelope_NodeConfiguration{NodeConfiguration: cfg}})
}

// NewLogRequest asks node's agent for a work item's log. It carries no
// revision: log requests are not state.
func NewLogRequest(node string, req *agentv1.LogRequest) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Payload: &agentv1.Envelope_LogRequest{LogRequest: req}})
}

// NewLogChunk builds part of the answer to a LogRequest.
func NewLogChunk(node string, c *agentv1.LogChunk) *agentv1.Envelope {
	return seal(&agentv1.Envelope{Node: node, Payload: &agentv1.Envelope_LogChunk{LogChunk: c}})
}

// seal gives e a fresh id and the kind its payload implies.
func seal(e *agentv1.Envelope) *agentv1.Envelope {
	e.Id = NewID()
	e.Kind = KindOf(e)
	return e
}
