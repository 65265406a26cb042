package protocol

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// Limits of an envelope. They are part of the protocol contract: a sender must
// stay within them and a receiver refuses anything beyond them.
const (
	// MaxEnvelopeBytes bounds an encoded envelope. It is also the gRPC
	// maximum message size on both sides.
	MaxEnvelopeBytes = 1 << 20
	// MaxIDBytes bounds an envelope id, an ack_of and a work uid.
	MaxIDBytes = 128
	// MaxNodeNameBytes bounds a node name (a DNS-1123 subdomain).
	MaxNodeNameBytes = 253
	// MaxSpecBytes bounds a work item's spec.
	MaxSpecBytes = 512 << 10
	// MaxMapEntries bounds the labels and capacity maps of a NodeInfo.
	MaxMapEntries = 64
	// MaxMapKeyBytes bounds a label or capacity key: a 253-byte DNS prefix,
	// '/', and a 63-byte name, as Kubernetes label keys.
	MaxMapKeyBytes = 317
	// MaxMapValueBytes bounds a label or capacity value.
	MaxMapValueBytes = 1024
	// MaxWorkItems bounds the items of a Snapshot and the work statuses of a
	// NodeState.
	MaxWorkItems = 4096
	// MaxTextBytes bounds free-text fields: phase, reason, message, hub,
	// agent_version, os, arch, hostname.
	MaxTextBytes = 1024
	// MaxMessageBytes bounds a WorkStatus message, which may quote output.
	MaxMessageBytes = 16 << 10
	// MaxLogChunkBytes bounds the data of a LogChunk.
	MaxLogChunkBytes = 64 << 10
	// MaxStatusBatch bounds the work statuses of one Status (work and more).
	MaxStatusBatch = 256
	// MaxAckIDs bounds the envelope ids one Ack settles (ack_of and more):
	// as many as a hub queues for one stream.
	MaxAckIDs = 256
	// MaxDispatchBatch bounds the work items of one Dispatch (item and
	// more).
	MaxDispatchBatch = 256
	// MaxFeatures bounds the features a GetMessageRequest names.
	MaxFeatures = 64
)

// Features an agent names in GetMessageRequest.features: protocol extensions
// a hub uses only with agents that name them, because an agent that does
// not know one would ignore what it adds without a word.
const (
	// FeatureDispatchBatch: the agent applies every item of a Dispatch
	// (Dispatch.more), so the hub may send a run of items in one envelope.
	FeatureDispatchBatch = "dispatch-batch"
	// FeatureApps: the agent runs serverless instances and sessions (work
	// types app-instance and app-session, internal/serverless/appwire); a
	// hub places instances only on nodes whose agent names it.
	FeatureApps = "apps"
)

// Log streams a LogRequest may name.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
)

// ErrMalformed is wrapped by every error that Validate and Decode return for a
// message that breaks the protocol. Such a message must not be retried as is.
var ErrMalformed = errors.New("malformed envelope")

// ErrTooLarge is wrapped by Decode and Encode when an encoded envelope exceeds
// MaxEnvelopeBytes.
var ErrTooLarge = errors.New("envelope too large")

// workTypeRE is the shape of a WorkItem type: a short lowercase name.
var workTypeRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// Validate checks an envelope against the protocol's rules: the id is
// non-empty printable ASCII of at most MaxIDBytes; node is a DNS-1123
// subdomain; kind is known, not UNSPECIFIED, and names the one payload that is
// set; an ACK carries ack_of; Snapshot, Dispatch, Cancel, NodeState and Status
// carry a revision > 0; and every payload field is within this package's
// limits. Each error wraps ErrMalformed and names the envelope, the field and
// the reason, e.g.
//
//	envelope "abc": kind KIND_DISPATCH but payload is heartbeat: malformed envelope
func Validate(e *agentv1.Envelope) error {
	if e == nil {
		return fmt.Errorf("envelope is nil: %w", ErrMalformed)
	}
	if reason := validate(e); reason != "" {
		return fmt.Errorf("envelope %s: %s: %w", quoteID(e.GetId()), reason, ErrMalformed)
	}
	return nil
}

// validate returns why e is malformed, or "" when it is not.
func validate(e *agentv1.Envelope) string {
	if r := checkID(e.GetId()); r != "" {
		return "id " + r
	}
	if err := ValidNodeName(e.GetNode()); err != nil {
		return err.Error()
	}
	kind := e.GetKind()
	if kind == agentv1.Kind_KIND_UNSPECIFIED {
		return "kind is KIND_UNSPECIFIED"
	}
	if _, known := agentv1.Kind_name[int32(kind)]; !known {
		return fmt.Sprintf("unknown kind %d", int32(kind))
	}
	payload := KindOf(e)
	if payload == agentv1.Kind_KIND_UNSPECIFIED {
		return fmt.Sprintf("kind %s but no payload is set", kind)
	}
	if payload != kind {
		return fmt.Sprintf("kind %s but payload is %s", kind, payloadName(payload))
	}
	if e.GetAckOf() != "" {
		if r := checkID(e.GetAckOf()); r != "" {
			return "ack_of " + r
		}
	}
	if needsRevision(kind) && e.GetRevision() == 0 {
		return fmt.Sprintf("kind %s needs a revision > 0", kind)
	}
	switch p := e.GetPayload().(type) {
	case *agentv1.Envelope_Heartbeat:
		if p.Heartbeat == nil {
			return "payload heartbeat is nil"
		}
	case *agentv1.Envelope_Ack:
		if p.Ack == nil {
			return "payload ack is nil"
		}
		if e.GetAckOf() == "" {
			return "kind KIND_ACK needs ack_of"
		}
		if n := len(p.Ack.GetMore()); n >= MaxAckIDs {
			return fmt.Sprintf("ack settles %d envelopes, more than %d", n+1, MaxAckIDs)
		}
		for i, id := range p.Ack.GetMore() {
			if r := checkID(id); r != "" {
				return fmt.Sprintf("ack.more[%d] %s", i, r)
			}
		}
	case *agentv1.Envelope_FullSyncRequest:
		if p.FullSyncRequest == nil {
			return "payload full_sync_request is nil"
		}
	case *agentv1.Envelope_NodeConfiguration:
		if p.NodeConfiguration == nil {
			return "payload node_configuration is nil"
		}
		if r := checkText(p.NodeConfiguration.GetHub(), MaxTextBytes); r != "" {
			return "node_configuration.hub " + r
		}
	case *agentv1.Envelope_Snapshot:
		if p.Snapshot == nil {
			return "payload snapshot is nil"
		}
		return checkSnapshot(p.Snapshot)
	case *agentv1.Envelope_Dispatch:
		if p.Dispatch == nil {
			return "payload dispatch is nil"
		}
		if p.Dispatch.GetItem() == nil {
			return "dispatch.item is not set"
		}
		if r := checkWorkItem(p.Dispatch.GetItem()); r != "" {
			return "dispatch.item " + r
		}
		if n := len(p.Dispatch.GetMore()); n >= MaxDispatchBatch {
			return fmt.Sprintf("dispatch carries %d work items, more than %d", n+1, MaxDispatchBatch)
		}
		for i, it := range p.Dispatch.GetMore() {
			if it == nil {
				return fmt.Sprintf("dispatch.more[%d] is nil", i)
			}
			if r := checkWorkItem(it); r != "" {
				return fmt.Sprintf("dispatch.more[%d] %s", i, r)
			}
		}
	case *agentv1.Envelope_Cancel:
		if p.Cancel == nil {
			return "payload cancel is nil"
		}
		if r := checkID(p.Cancel.GetUid()); r != "" {
			return "cancel.uid " + r
		}
	case *agentv1.Envelope_Status:
		if p.Status == nil {
			return "payload status is nil"
		}
		if p.Status.GetWork() == nil {
			return "status.work is not set"
		}
		if r := checkWorkStatus(p.Status.GetWork()); r != "" {
			return "status.work " + r
		}
		if n := len(p.Status.GetMore()); n >= MaxStatusBatch {
			return fmt.Sprintf("status carries %d work statuses, more than %d", n+1, MaxStatusBatch)
		}
		for i, w := range p.Status.GetMore() {
			if w == nil {
				return fmt.Sprintf("status.more[%d] is nil", i)
			}
			if r := checkWorkStatus(w); r != "" {
				return fmt.Sprintf("status.more[%d] %s", i, r)
			}
		}
	case *agentv1.Envelope_NodeState:
		if p.NodeState == nil {
			return "payload node_state is nil"
		}
		return checkNodeState(p.NodeState)
	case *agentv1.Envelope_LogRequest:
		if p.LogRequest == nil {
			return "payload log_request is nil"
		}
		return checkLogRequest(p.LogRequest)
	case *agentv1.Envelope_LogChunk:
		if p.LogChunk == nil {
			return "payload log_chunk is nil"
		}
		return checkLogChunk(p.LogChunk)
	}
	return ""
}

func checkLogRequest(r *agentv1.LogRequest) string {
	if c := checkID(r.GetRequestId()); c != "" {
		return "log_request.request_id " + c
	}
	if c := checkID(r.GetUid()); c != "" {
		return "log_request.uid " + c
	}
	if s := r.GetStream(); s != LogStdout && s != LogStderr {
		return fmt.Sprintf("log_request.stream %q is not %s or %s", clip(s), LogStdout, LogStderr)
	}
	return ""
}

func checkLogChunk(c *agentv1.LogChunk) string {
	if r := checkID(c.GetRequestId()); r != "" {
		return "log_chunk.request_id " + r
	}
	if n := len(c.GetData()); n > MaxLogChunkBytes {
		return fmt.Sprintf("log_chunk.data is %d bytes, more than %d", n, MaxLogChunkBytes)
	}
	if r := checkText(c.GetError(), MaxTextBytes); r != "" {
		return "log_chunk.error " + r
	}
	return ""
}

// needsRevision reports whether kind carries ordered state and so a revision.
func needsRevision(k agentv1.Kind) bool {
	switch k {
	case agentv1.Kind_KIND_SNAPSHOT, agentv1.Kind_KIND_DISPATCH, agentv1.Kind_KIND_CANCEL,
		agentv1.Kind_KIND_NODE_STATE, agentv1.Kind_KIND_STATUS:
		return true
	}
	return false
}

func checkSnapshot(s *agentv1.Snapshot) string {
	if n := len(s.GetItems()); n > MaxWorkItems {
		return fmt.Sprintf("snapshot has %d items, more than %d", n, MaxWorkItems)
	}
	seen := make(map[string]int, len(s.GetItems()))
	for i, it := range s.GetItems() {
		if it == nil {
			return fmt.Sprintf("snapshot.items[%d] is nil", i)
		}
		if r := checkWorkItem(it); r != "" {
			return fmt.Sprintf("snapshot.items[%d] %s", i, r)
		}
		if j, dup := seen[it.GetUid()]; dup {
			return fmt.Sprintf("snapshot.items[%d] uid %q repeats items[%d]", i, it.GetUid(), j)
		}
		seen[it.GetUid()] = i
	}
	return ""
}

func checkWorkItem(w *agentv1.WorkItem) string {
	if r := checkID(w.GetUid()); r != "" {
		return "uid " + r
	}
	if !workTypeRE.MatchString(w.GetType()) {
		return fmt.Sprintf("uid %q: type %q does not match %s", w.GetUid(), clip(w.GetType()), workTypeRE)
	}
	if n := len(w.GetSpec()); n > MaxSpecBytes {
		return fmt.Sprintf("uid %q: spec is %d bytes, more than %d", w.GetUid(), n, MaxSpecBytes)
	}
	return ""
}

func checkWorkStatus(w *agentv1.WorkStatus) string {
	if r := checkID(w.GetUid()); r != "" {
		return "uid " + r
	}
	if r := checkText(w.GetPhase(), MaxTextBytes); r != "" {
		return fmt.Sprintf("uid %q: phase %s", w.GetUid(), r)
	}
	if r := checkText(w.GetReason(), MaxTextBytes); r != "" {
		return fmt.Sprintf("uid %q: reason %s", w.GetUid(), r)
	}
	if n := len(w.GetMessage()); n > MaxMessageBytes {
		return fmt.Sprintf("uid %q: message is %d bytes, more than %d", w.GetUid(), n, MaxMessageBytes)
	}
	return ""
}

func checkNodeState(s *agentv1.NodeState) string {
	if info := s.GetInfo(); info != nil {
		if r := checkNodeInfo(info); r != "" {
			return "node_state.info." + r
		}
	}
	if n := len(s.GetWork()); n > MaxWorkItems {
		return fmt.Sprintf("node_state has %d work statuses, more than %d", n, MaxWorkItems)
	}
	seen := make(map[string]int, len(s.GetWork()))
	for i, w := range s.GetWork() {
		if w == nil {
			return fmt.Sprintf("node_state.work[%d] is nil", i)
		}
		if r := checkWorkStatus(w); r != "" {
			return fmt.Sprintf("node_state.work[%d] %s", i, r)
		}
		if j, dup := seen[w.GetUid()]; dup {
			return fmt.Sprintf("node_state.work[%d] uid %q repeats work[%d]", i, w.GetUid(), j)
		}
		seen[w.GetUid()] = i
	}
	return ""
}

// CheckFeatures validates the features a GetMessageRequest names: at most
// MaxFeatures, each a short printable text. Unknown names are valid (a newer
// agent may know more than this hub). Errors wrap ErrMalformed.
func CheckFeatures(fs []string) error {
	if len(fs) > MaxFeatures {
		return fmt.Errorf("%d features, more than %d: %w", len(fs), MaxFeatures, ErrMalformed)
	}
	for i, f := range fs {
		if r := checkID(f); r != "" {
			return fmt.Errorf("features[%d] %s: %w", i, r, ErrMalformed)
		}
	}
	return nil
}

// CheckNodeInfo validates the NodeInfo an agent reports, in a NodeState or in
// a GetMessageRequest or RegisterRequest. A nil info is valid (nothing
// reported). Errors wrap ErrMalformed.
func CheckNodeInfo(info *agentv1.NodeInfo) error {
	if info == nil {
		return nil
	}
	if r := checkNodeInfo(info); r != "" {
		return fmt.Errorf("node info: %s: %w", r, ErrMalformed)
	}
	return nil
}

func checkNodeInfo(info *agentv1.NodeInfo) string {
	if r := checkMap(info.GetLabels()); r != "" {
		return "labels " + r
	}
	if r := checkMap(info.GetCapacity()); r != "" {
		return "capacity " + r
	}
	for _, f := range []struct{ name, v string }{
		{"agent_version", info.GetAgentVersion()},
		{"os", info.GetOs()},
		{"arch", info.GetArch()},
		{"hostname", info.GetHostname()},
	} {
		if r := checkText(f.v, MaxTextBytes); r != "" {
			return f.name + " " + r
		}
	}
	return ""
}

func checkMap(m map[string]string) string {
	if len(m) > MaxMapEntries {
		return fmt.Sprintf("has %d entries, more than %d", len(m), MaxMapEntries)
	}
	for k, v := range m {
		switch {
		case k == "":
			return "has an empty key"
		case len(k) > MaxMapKeyBytes:
			return fmt.Sprintf("key %q is %d bytes, more than %d", clip(k), len(k), MaxMapKeyBytes)
		case len(v) > MaxMapValueBytes:
			return fmt.Sprintf("value of %q is %d bytes, more than %d", clip(k), len(v), MaxMapValueBytes)
		}
	}
	return ""
}

// checkID returns why s is not a valid id: non-empty, at most MaxIDBytes,
// printable ASCII without spaces (ids appear unquoted in logs and as SQLite
// keys).
func checkID(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > MaxIDBytes {
		return fmt.Sprintf("is %d bytes, more than %d", len(s), MaxIDBytes)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return fmt.Sprintf("has byte %#02x at %d, want printable ASCII", c, i)
		}
	}
	return ""
}

// checkText returns why s is not acceptable free text of at most max bytes.
// UTF-8 validity is enforced by proto3 itself.
func checkText(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("is %d bytes, more than %d", len(s), max)
	}
	return ""
}

// quoteID quotes an envelope id for an error message, clipped so that a
// hostile id cannot flood the logs.
func quoteID(id string) string { return fmt.Sprintf("%q", clip(id)) }

// clip shortens s for an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
