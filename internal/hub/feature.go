package hub

import (
	"context"
	"errors"
	"fmt"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// Feature is the hub side of one kind of work (node jobs, tasks, the next
// ones): every feature plugs into the hub the same way, through
// Options.Features. The hub owns the agents' streams; a feature owns a set
// of work uids, says which items each node should hold (WorkSource), and
// follows what agents report about them (StatusSink). It acts on nodes
// through the Link the hub gives it in Attach.
//
// Adding a feature is a package implementing Feature and one line in the
// hub's composition root (internal/hubsetup).
//
// Optional powers are separate interfaces the hub finds by type assertion:
// Readier (the feature's caches are still loading) and LogFinder (the
// feature can locate a task's logs, for the Operator service's TaskLogs).
type Feature interface {
	// Name is the feature's one word (nodejob, task), for errors, logs and
	// metrics. Names are unique within a hub.
	Name() string
	// Owns reports whether work uid is this feature's. The hub routes each
	// report to the first feature that owns its uid, and refuses a
	// feature's Dispatch or Call of an item it does not own (its reports
	// would reach no one). It is called on every report: keep it cheap.
	Owns(uid string) bool
	// Assigned reports whether work uid, which the feature owns, is node's:
	// the feature sent it (or its snapshot lists it) to node. A node is
	// trusted with its own work only: the hub drops a report of a uid not
	// assigned to the sending node before it reaches the feature or a
	// Call, counts it (drover_hub_reports_foreign_total) and logs it once.
	// Answer from the feature's own state: true for the node a dispatch in
	// flight goes to (its first report may come before the feature's
	// caches show the send), false for every other node, and false for
	// work the feature does not know. It is called on every report: keep
	// it cheap.
	Assigned(ctx context.Context, node, uid string) bool
	// Attach hands the feature its link to the hub. The hub calls it once,
	// in New, before it serves any agent.
	Attach(Link)
	// WorkFor lists the items node should hold, for the node's snapshots.
	// The hub merges every feature's list; one feature failing fails the
	// snapshot (an agent cancels what a snapshot leaves out).
	WorkSource
	// WorkStatus and NodeState receive the reports of the uids the feature
	// owns and assigned to the reporting node; a NodeState carries that
	// part of the node's state, possibly empty (it replaces what the
	// feature knew of the node).
	StatusSink
}

// WorkSource lists the work items a node should hold.
type WorkSource interface {
	WorkFor(ctx context.Context, node string) ([]*agentv1.WorkItem, error)
}

// StatusSink consumes agents' work reports.
//
// The hub calls it on the goroutine of the agent's SendMessage call, after
// the report passed validation and the revision check, and before it answers
// the agent: a slow sink delays that agent's next report (bounded by the
// agent's call timeout), never other agents. A sink must not block for long;
// it should hand work that talks to the API to its own queue.
//
// Delivery is at least once: a report the hub applied but whose answer the
// agent never got is sent again after a reconnect, possibly to another hub.
// Within one stream a report is delivered once and in revision order. After
// a gap in the agent's revisions (a report lost or refused) the statuses up
// to the agent's next NodeState are not delivered: that NodeState covers
// them, so a sink that must not miss an end reconciles from NodeState.
type StatusSink interface {
	// WorkStatus is one change of one work item, e.g. Running -> Succeeded.
	WorkStatus(ctx context.Context, node string, st *agentv1.WorkStatus)
	// NodeState is the agent's whole view of its work. It comes on every
	// connect and after the hub asked for a full sync (a revision gap), and
	// replaces whatever the sink derived from earlier reports of node.
	NodeState(ctx context.Context, node string, work []*agentv1.WorkStatus)
}

// Readier is a Feature that can tell it has not loaded yet (its caches are
// syncing). Until every such feature is ready the hub refuses agents'
// streams as Unavailable, which they retry shortly, rather than marking the
// node Online and then failing to build its snapshot.
type Readier interface {
	Ready() bool
}

// LogFinder is a Feature that can locate a task's logs: LogTarget finds the
// node and agent work uid of an attempt of the task namespace/name (0: the
// current one). Errors that are gRPC statuses are passed on; a NotFound API
// error becomes NotFound. At most one feature of a hub finds logs; without
// one, the Operator service's TaskLogs is Unimplemented.
type LogFinder interface {
	LogTarget(ctx context.Context, namespace, name string, attempt int32) (node, uid string, err error)
}

// Link is what a feature may do through the hub it is attached to.
type Link interface {
	// Dispatch sends one work item to a node connected to this hub. The
	// item is re-sent (in a snapshot) if the agent reconnects before acking
	// it, as long as the feature's WorkFor still lists it.
	Dispatch(node string, item *agentv1.WorkItem) error
	// Cancel asks a node connected to this hub to stop work item uid.
	Cancel(node, uid string) error
	// Connected reports whether node has a stream open on this hub.
	Connected(node string) bool
	// Supports reports whether the agent of node, connected to this hub,
	// named protocol feature when it opened its stream; false when node
	// has no stream here. A feature whose items an older agent would
	// misread or run unsafely checks it before it dispatches them and
	// while it builds node's snapshot (WorkFor). The answer holds for the
	// stream it was read from: an agent names its features on every
	// connect, so a reconnect may change it.
	Supports(node, feature string) bool
	// HubName is the name of the hub, as FleetNode status shows it.
	HubName() string
	// Address is the IP address node's stream on this hub comes from, for
	// what clients connect to on the node (a session's endpoint); "" when
	// node has no stream here or its transport does not tell (MQTT).
	Address(node string) string
	// Call dispatches item to node and waits for the first report of its
	// uid from that node that done accepts (nil accepts any), and returns
	// it: a request answered by the agent within milliseconds (a session
	// open). It fails at once with ErrNotConnected if node has no stream
	// here, and when ctx ends. The report also reaches the feature's
	// WorkStatus (or NodeState), before Call returns it.
	Call(ctx context.Context, node string, item *agentv1.WorkItem, done func(*agentv1.WorkStatus) bool) (*agentv1.WorkStatus, error)
}

// ErrNotConnected is returned by Call when the node has no stream on the hub.
var ErrNotConnected = errors.New("node is not connected to this hub")

// link is the Link a hub gives one feature: the hub's own operations, and a
// check that the feature sends only uids it owns.
type link struct {
	h *Hub
	f Feature
}

var _ Link = link{}

func (l link) owned(op string, node string, item *agentv1.WorkItem) error {
	if !l.f.Owns(item.GetUid()) {
		return fmt.Errorf("%s %s to node %s: feature %s does not own the uid, so the agent's reports would reach no feature", op, item.GetUid(), node, l.f.Name())
	}
	return nil
}

func (l link) Dispatch(node string, item *agentv1.WorkItem) error {
	if err := l.owned("dispatch", node, item); err != nil {
		return err
	}
	return l.h.Dispatch(node, item)
}

func (l link) Cancel(node, uid string) error { return l.h.Cancel(node, uid) }
func (l link) Connected(node string) bool    { return l.h.Connected(node) }
func (l link) HubName() string               { return l.h.Name() }
func (l link) Address(node string) string    { return l.h.Address(node) }

func (l link) Supports(node, feature string) bool { return l.h.Supports(node, feature) }

func (l link) Call(ctx context.Context, node string, item *agentv1.WorkItem, done func(*agentv1.WorkStatus) bool) (*agentv1.WorkStatus, error) {
	if err := l.owned("call", node, item); err != nil {
		return nil, err
	}
	return l.h.Call(ctx, node, item, done)
}
