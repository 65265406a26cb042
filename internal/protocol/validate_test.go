package protocol

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// valid returns one valid envelope of every kind, with fixed ids.
func valid() map[string]*agentv1.Envelope {
	envs := map[string]*agentv1.Envelope{
		"heartbeat":                NewHeartbeat("node-1"),
		"ack":                      NewAck("node-1", "0123abcd"),
		"status batch":             NewStatuses("node-1", 4, []*agentv1.WorkStatus{{Uid: "a", Phase: "Running"}, {Uid: "b", Phase: "Succeeded"}, {Uid: "c", Phase: "Failed", Reason: "exit 1"}}),
		"ack of several":           NewAck("node-1", "0123abcd", "4567", "89ab"),
		"full sync request":        NewFullSyncRequest("node-1", 7),
		"node configuration":       NewNodeConfiguration("node-1", &agentv1.NodeConfiguration{HeartbeatSeconds: 10, Hub: "hub.example:443"}),
		"empty node configuration": NewNodeConfiguration("node-1", nil),
		"snapshot": NewSnapshot("node-1", 3, []*agentv1.WorkItem{
			{Uid: "u1", Type: "noop", Spec: []byte(`{}`)},
			{Uid: "u2", Type: "upgrade-os"},
		}),
		"empty snapshot": NewSnapshot("node-1", 1, nil),
		"dispatch":       NewDispatch("node-1", 4, &agentv1.WorkItem{Uid: "u3", Type: "task", Spec: []byte(`{"cmd":"true"}`)}),
		"dispatch batch": NewDispatches("node-1", 4, []*agentv1.WorkItem{{Uid: "u3", Type: "task"}, {Uid: "u4", Type: "noop"}, {Uid: "u5", Type: "noop", Spec: []byte(`{}`)}}),
		"cancel":         NewCancel("node-1", 5, "u3"),
		"status":         NewStatus("node-1", 2, &agentv1.WorkStatus{Uid: "u3", Phase: "Running", Reason: "Started", Message: "ok"}),
		"node state": NewNodeState("edge-7.rack-2.example.com", 9,
			&agentv1.NodeInfo{
				Labels:   map[string]string{"drover.dev/pool": "edge", "zone": "a"},
				Capacity: map[string]string{"cpu": "4", "memory": "8Gi"},
				Os:       "linux", Arch: "amd64", AgentVersion: "v0.1.0", Hostname: "edge-7",
			},
			[]*agentv1.WorkStatus{{Uid: "u1", Phase: "Succeeded"}, {Uid: "u2"}}),
		"node state without info": NewNodeState("n", 1, nil, nil),
		"log request":             NewLogRequest("node-1", &agentv1.LogRequest{RequestId: "r1", Uid: "task-u-1", Stream: LogStdout, Follow: true, TailBytes: 100}),
		"log chunk":               NewLogChunk("node-1", &agentv1.LogChunk{RequestId: "r1", Data: []byte("hello\n")}),
		"last log chunk":          NewLogChunk("node-1", &agentv1.LogChunk{RequestId: "r1", Eof: true}),
	}
	for name, e := range envs {
		e.Id = "id-" + strings.ReplaceAll(name, " ", "-")
	}
	return envs
}

func TestValidateAcceptsEveryKind(t *testing.T) {
	seen := map[agentv1.Kind]bool{}
	for name, e := range valid() {
		if err := Validate(e); err != nil {
			t.Errorf("Validate(%s) = %v, want nil", name, err)
		}
		seen[e.GetKind()] = true
	}
	for k := range agentv1.Kind_name {
		if kind := agentv1.Kind(k); kind != agentv1.Kind_KIND_UNSPECIFIED && !seen[kind] {
			t.Errorf("no valid %v envelope in the test set", kind)
		}
	}
}

func TestConstructorsDeriveTheKindFromThePayload(t *testing.T) {
	for name, e := range valid() {
		if got := KindOf(e); got != e.GetKind() {
			t.Errorf("%s: KindOf() = %v, Kind = %v", name, got, e.GetKind())
		}
	}
	if got := KindOf(&agentv1.Envelope{}); got != agentv1.Kind_KIND_UNSPECIFIED {
		t.Errorf("KindOf(no payload) = %v, want KIND_UNSPECIFIED", got)
	}
	if got := KindOf(nil); got != agentv1.Kind_KIND_UNSPECIFIED {
		t.Errorf("KindOf(nil) = %v, want KIND_UNSPECIFIED", got)
	}
	a, b := NewHeartbeat("n"), NewHeartbeat("n")
	if a.GetId() == b.GetId() {
		t.Errorf("two NewHeartbeat calls share id %q", a.GetId())
	}
}

func TestValidateRejects(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	bigMap := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	tests := []struct {
		name   string
		base   string // key of valid()
		mutate func(e *agentv1.Envelope)
		want   string // the error must contain this
	}{
		{"an empty id", "heartbeat", func(e *agentv1.Envelope) { e.Id = "" }, `envelope "": id is empty`},
		{"an id over 128 bytes", "heartbeat", func(e *agentv1.Envelope) { e.Id = long(129) }, "id is 129 bytes, more than 128"},
		{"an id with a space", "heartbeat", func(e *agentv1.Envelope) { e.Id = "a b" }, "id has byte 0x20 at 1"},
		{"an id with a control byte", "heartbeat", func(e *agentv1.Envelope) { e.Id = "a\n" }, "id has byte 0x0a at 1"},
		{"an id with non-ASCII", "heartbeat", func(e *agentv1.Envelope) { e.Id = "é" }, "id has byte 0xc3 at 0"},
		{"an empty node", "heartbeat", func(e *agentv1.Envelope) { e.Node = "" }, `node "": is empty`},
		{"an uppercase node", "heartbeat", func(e *agentv1.Envelope) { e.Node = "Node" }, `node "Node": has 'N' at 0`},
		{"a node with an underscore", "heartbeat", func(e *agentv1.Envelope) { e.Node = "a_b" }, `has '_' at 1`},
		{"a node ending in a dash", "heartbeat", func(e *agentv1.Envelope) { e.Node = "a.b-" }, `label "b-" must start and end`},
		{"a node with an empty label", "heartbeat", func(e *agentv1.Envelope) { e.Node = "a..b" }, "empty label at 2"},
		{"a node over 253 bytes", "heartbeat", func(e *agentv1.Envelope) { e.Node = long(254) }, "is 254 bytes, more than 253"},
		{"kind UNSPECIFIED", "heartbeat", func(e *agentv1.Envelope) { e.Kind = agentv1.Kind_KIND_UNSPECIFIED }, "kind is KIND_UNSPECIFIED"},
		{"an unknown kind", "heartbeat", func(e *agentv1.Envelope) { e.Kind = 42 }, "unknown kind 42"},
		{"no payload", "heartbeat", func(e *agentv1.Envelope) { e.Payload = nil }, "kind KIND_HEARTBEAT but no payload is set"},
		{"a kind that does not match the payload", "heartbeat", func(e *agentv1.Envelope) { e.Kind = agentv1.Kind_KIND_DISPATCH },
			`envelope "id-heartbeat": kind KIND_DISPATCH but payload is heartbeat: malformed envelope`},
		{"a nil heartbeat", "heartbeat", func(e *agentv1.Envelope) { e.Payload = &agentv1.Envelope_Heartbeat{} }, "payload heartbeat is nil"},
		{"an ack without ack_of", "ack", func(e *agentv1.Envelope) { e.AckOf = "" }, "kind KIND_ACK needs ack_of"},
		{"an ack_of that is not an id", "ack", func(e *agentv1.Envelope) { e.AckOf = "x y" }, "ack_of has byte 0x20"},
		{"an ack of more that is not an id", "ack", func(e *agentv1.Envelope) { e.GetAck().More = []string{"ok", ""} }, "ack.more[1] is empty"},
		{"a status batch with a bad item", "status batch", func(e *agentv1.Envelope) { e.GetStatus().More[1].Uid = "" }, "status.more[1] uid is empty"},
		{"a status batch of too many", "status batch", func(e *agentv1.Envelope) {
			e.GetStatus().More = make([]*agentv1.WorkStatus, MaxStatusBatch)
			for i := range e.GetStatus().More {
				e.GetStatus().More[i] = &agentv1.WorkStatus{Uid: "u", Phase: "Running"}
			}
		}, "status carries 257 work statuses, more than 256"},
		{"a dispatch batch with a bad item", "dispatch batch", func(e *agentv1.Envelope) { e.GetDispatch().More[1].Type = "Bad" }, `dispatch.more[1] uid "u5": type "Bad"`},
		{"a dispatch batch with a nil item", "dispatch batch", func(e *agentv1.Envelope) { e.GetDispatch().More[0] = nil }, "dispatch.more[0] is nil"},
		{"a dispatch batch of too many", "dispatch batch", func(e *agentv1.Envelope) {
			e.GetDispatch().More = make([]*agentv1.WorkItem, MaxDispatchBatch)
			for i := range e.GetDispatch().More {
				e.GetDispatch().More[i] = &agentv1.WorkItem{Uid: fmt.Sprint("u", i), Type: "noop"}
			}
		}, "dispatch carries 257 work items, more than 256"},
		{"an ack of too many", "ack", func(e *agentv1.Envelope) { e.GetAck().More = make([]string, MaxAckIDs) }, "ack settles 257 envelopes, more than 256"},
		{"a snapshot without revision", "snapshot", func(e *agentv1.Envelope) { e.Revision = 0 }, "kind KIND_SNAPSHOT needs a revision > 0"},
		{"a dispatch without revision", "dispatch", func(e *agentv1.Envelope) { e.Revision = 0 }, "kind KIND_DISPATCH needs a revision > 0"},
		{"a cancel without revision", "cancel", func(e *agentv1.Envelope) { e.Revision = 0 }, "kind KIND_CANCEL needs a revision > 0"},
		{"a status without revision", "status", func(e *agentv1.Envelope) { e.Revision = 0 }, "kind KIND_STATUS needs a revision > 0"},
		{"a node state without revision", "node state", func(e *agentv1.Envelope) { e.Revision = 0 }, "kind KIND_NODE_STATE needs a revision > 0"},
		{"a dispatch without item", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item = nil }, "dispatch.item is not set"},
		{"a work item without uid", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item.Uid = "" }, "dispatch.item uid is empty"},
		{"a work uid over 128 bytes", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item.Uid = long(129) }, "dispatch.item uid is 129 bytes"},
		{"a work item without type", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item.Type = "" }, `type "" does not match`},
		{"a work type with uppercase", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item.Type = "Task" }, `type "Task" does not match`},
		{"a work type starting with a digit", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item.Type = "1task" }, `type "1task"`},
		{"a work type over 63 bytes", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item.Type = long(64) }, "does not match"},
		{"a spec over 512 KiB", "dispatch", func(e *agentv1.Envelope) { e.GetDispatch().Item.Spec = make([]byte, 512<<10+1) },
			`uid "u3": spec is 524289 bytes, more than 524288`},
		{"a nil snapshot item", "snapshot", func(e *agentv1.Envelope) { e.GetSnapshot().Items[1] = nil }, "snapshot.items[1] is nil"},
		{"a bad snapshot item", "snapshot", func(e *agentv1.Envelope) { e.GetSnapshot().Items[1].Type = "" }, "snapshot.items[1] uid \"u2\": type"},
		{"a repeated snapshot uid", "snapshot", func(e *agentv1.Envelope) { e.GetSnapshot().Items[1].Uid = "u1" }, `snapshot.items[1] uid "u1" repeats items[0]`},
		{"too many snapshot items", "snapshot", func(e *agentv1.Envelope) {
			e.GetSnapshot().Items = make([]*agentv1.WorkItem, MaxWorkItems+1)
		}, "snapshot has 4097 items, more than 4096"},
		{"a cancel without uid", "cancel", func(e *agentv1.Envelope) { e.GetCancel().Uid = "" }, "cancel.uid is empty"},
		{"a status without work", "status", func(e *agentv1.Envelope) { e.GetStatus().Work = nil }, "status.work is not set"},
		{"a status without uid", "status", func(e *agentv1.Envelope) { e.GetStatus().Work.Uid = "" }, "status.work uid is empty"},
		{"a status with a huge reason", "status", func(e *agentv1.Envelope) { e.GetStatus().Work.Reason = long(1025) }, `uid "u3": reason is 1025 bytes`},
		{"a status with a huge message", "status", func(e *agentv1.Envelope) { e.GetStatus().Work.Message = long(16<<10 + 1) }, "message is 16385 bytes"},
		{"too many labels", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Info.Labels = bigMap(65) }, "node_state.info.labels has 65 entries, more than 64"},
		{"too many capacity entries", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Info.Capacity = bigMap(65) }, "node_state.info.capacity has 65 entries"},
		{"an empty label key", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Info.Labels[""] = "x" }, "labels has an empty key"},
		{"a label key over 317 bytes", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Info.Labels[long(318)] = "x" }, "is 318 bytes, more than 317"},
		{"a label value over 1024 bytes", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Info.Labels["zone"] = long(1025) }, `value of "zone" is 1025 bytes`},
		{"a huge hostname", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Info.Hostname = long(1025) }, "node_state.info.hostname is 1025 bytes"},
		{"a nil work status", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Work[0] = nil }, "node_state.work[0] is nil"},
		{"a repeated work status", "node state", func(e *agentv1.Envelope) { e.GetNodeState().Work[1].Uid = "u1" }, `node_state.work[1] uid "u1" repeats work[0]`},
		{"a log request without id", "log request", func(e *agentv1.Envelope) { e.GetLogRequest().RequestId = "" }, "log_request.request_id is empty"},
		{"a log request without uid", "log request", func(e *agentv1.Envelope) { e.GetLogRequest().Uid = "" }, "log_request.uid is empty"},
		{"a log request for another file", "log request", func(e *agentv1.Envelope) { e.GetLogRequest().Stream = "../agent.db" }, `log_request.stream "../agent.db" is not stdout or stderr`},
		{"a log chunk over 64 KiB", "log chunk", func(e *agentv1.Envelope) { e.GetLogChunk().Data = make([]byte, 64<<10+1) }, "log_chunk.data is 65537 bytes, more than 65536"},
		{"a log chunk without request", "log chunk", func(e *agentv1.Envelope) { e.GetLogChunk().RequestId = "" }, "log_chunk.request_id is empty"},
		{"a huge hub address", "node configuration", func(e *agentv1.Envelope) { e.GetNodeConfiguration().Hub = long(1025) }, "node_configuration.hub is 1025 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, ok := valid()[tt.base]
			if !ok {
				t.Fatalf("no valid envelope %q", tt.base)
			}
			tt.mutate(e)
			err := Validate(e)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Validate(%s) = %v, want an error wrapping ErrMalformed", tt.name, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate(%s) = %q, want it to contain %q", tt.name, err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "envelope ") || !strings.HasSuffix(err.Error(), ": malformed envelope") {
				t.Errorf("Validate(%s) = %q, want \"envelope <id>: ...: malformed envelope\"", tt.name, err)
			}
		})
	}
}

func TestValidateNil(t *testing.T) {
	if err := Validate(nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("Validate(nil) = %v, want ErrMalformed", err)
	}
}

func TestValidateClipsHostileIDs(t *testing.T) {
	e := NewHeartbeat("n")
	e.Id = strings.Repeat("x", 10000)
	err := Validate(e)
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("Validate(10000-byte id) = %d-byte error, want a short one", len(err.Error()))
	}
}

func TestValidNodeName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"0", true},
		{"node-1", true},
		{"edge-7.rack-2.example.com", true},
		{"1.2.3.4", true},
		{strings.Repeat("a", 253), true},
		{strings.Repeat("a", 100) + "." + strings.Repeat("b", 100), true}, // no 63-byte label limit, as Kubernetes
		{"", false},
		{strings.Repeat("a", 254), false},
		{"-a", false},
		{"a-", false},
		{".a", false},
		{"a.", false},
		{"a..b", false},
		{"a.-b", false},
		{"A", false},
		{"a_b", false},
		{"a b", false},
		{"a/b", false},
		{"ä", false},
	}
	for _, tt := range tests {
		err := ValidNodeName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidNodeName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidNodeName) {
			t.Errorf("ValidNodeName(%q) = %v, want it to wrap ErrInvalidNodeName", tt.name, err)
		}
	}
}

func TestCheckNodeInfo(t *testing.T) {
	if err := CheckNodeInfo(nil); err != nil {
		t.Errorf("CheckNodeInfo(nil) = %v", err)
	}
	if err := CheckNodeInfo(&agentv1.NodeInfo{Labels: map[string]string{"": "x"}}); !errors.Is(err, ErrMalformed) {
		t.Errorf("CheckNodeInfo(empty key) = %v, want ErrMalformed", err)
	}
}

func TestCheckFeatures(t *testing.T) {
	many := make([]string, MaxFeatures+1)
	for i := range many {
		many[i] = fmt.Sprint("f", i)
	}
	tests := []struct {
		name     string
		features []string
		want     string // "" valid, else in the error
	}{
		{"none", nil, ""},
		{"known and unknown names", []string{FeatureDispatchBatch, "from-a-newer-agent"}, ""},
		{"as many as allowed", many[:MaxFeatures], ""},
		{"too many", many, "65 features, more than 64"},
		{"an empty name", []string{FeatureDispatchBatch, ""}, "features[1] is empty"},
		{"a name with a space", []string{"a b"}, "features[0] has byte 0x20"},
	}
	for _, tc := range tests {
		err := CheckFeatures(tc.features)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrMalformed)) {
			t.Errorf("%s: CheckFeatures = %v, want %q", tc.name, err, tc.want)
		}
	}
}
