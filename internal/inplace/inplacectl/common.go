package inplacectl

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Annotations the controllers keep on FleetNodes.
const (
	// AnnotationTargetRevision is the pool revision a node is being
	// updated to; it becomes its pool-revision label once updated.
	AnnotationTargetRevision = "update.drover.io/target-revision"
	// AnnotationAttempt counts a node's update runs in a plan: a re-run
	// after remediation makes new tasks.
	AnnotationAttempt = "update.drover.io/attempt"
	// AnnotationRemediatedAt is when a NodeHealthCheck's remediation of
	// the node ended: a node failed before it is updated again.
	AnnotationRemediatedAt = "update.drover.io/remediated-at"
	// AnnotationCordonedBy names the plan for whose update the pool
	// cordoned the node (spec.unschedulable): only such a cordon is undone
	// afterwards; an operator's own stays.
	AnnotationCordonedBy = "update.drover.io/cordoned-by"
	// LabelAttempt on tasks: the node's attempt they belong to.
	LabelAttempt = "update.drover.io/attempt"
)

// Options are what every in-place update controller shares.
type Options struct {
	Client client.Client
	// APIReader reads around the cache where a stale object would undo
	// work (a plan that already ended must not start again); nil means
	// Client.
	APIReader client.Reader
	// Recorder records Events; nil records none.
	Recorder events.EventRecorder
	// Metrics counts ends of updates and remediations; nil counts none.
	Metrics *Metrics
	// Clock is the time source; nil = the wall clock.
	Clock clock.Clock
	// Observer, if set, sees every action of the workflows.
	Observer ctrlkit.Observer
	// AbortTimeout bounds a node's wait for its tasks to abort; 0 means
	// inplace.DefaultAbortTimeout.
	AbortTimeout time.Duration
}

func (o Options) now() time.Time { return clock.Or(o.Clock).Now() }

func (o Options) event(obj client.Object, typ, reason, note string) {
	if o.Recorder != nil {
		o.Recorder.Eventf(obj, nil, typ, reason, "InPlaceUpdate", "%s", note)
	}
}

// setCondition sets a condition and reports whether it changed.
func setCondition(conds *[]metav1.Condition, typ string, status metav1.ConditionStatus, reason, msg string, gen int64) bool {
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	return meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

func boolStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

func (o Options) reader() client.Reader {
	if o.APIReader != nil {
		return o.APIReader
	}
	return o.Client
}

// templateSpec reads the template ref names and returns its
// spec.template.spec (Cluster API's template convention), empty if it has
// none: what an updater's task or an external remediation is made from.
func templateSpec(ctx context.Context, c client.Reader, ref updatev1.ObjectRef) (map[string]any, error) {
	tmpl := &unstructured.Unstructured{}
	tmpl.SetAPIVersion(ref.APIVersion)
	tmpl.SetKind(ref.Kind)
	if err := c.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, tmpl); err != nil {
		return nil, fmt.Errorf("get template %s %s: %w", ref.Kind, ref.Name, err)
	}
	spec, _, _ := unstructured.NestedMap(tmpl.Object, "spec", "template", "spec")
	if spec == nil {
		spec = map[string]any{}
	}
	return spec, nil
}

// updateAttempt names the pick a node is in: its plan and attempt.
func updateAttempt(n *fleetv1.FleetNode) string {
	return n.Labels[updatev1.LabelUpdateTaskName] + "/" + n.Annotations[AnnotationAttempt]
}

// ProgressInterval is how often a plan or pool writes status changes
// that are only progress (counts, and condition messages made of them):
// on a fleet, every node's step would otherwise rewrite the plan and its
// pool, several writes per node for figures a person reads every few
// seconds. Phase, reason and failure changes are written at once.
const ProgressInterval = 5 * time.Second

// progressThrottle remembers when each object's progress was last
// written. It belongs to one reconciler; entries go when the object ends.
type progressThrottle struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// wait returns how long the progress-only write of name must wait (0:
// write now, recorded as written).
func (t *progressThrottle) wait(name string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[string]time.Time{}
	}
	if left := t.last[name].Add(ProgressInterval).Sub(now); left > 0 {
		return left
	}
	t.last[name] = now
	return 0
}

// wrote records a write of name (any kind); done forgets it.
func (t *progressThrottle) wrote(name string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[string]time.Time{}
	}
	t.last[name] = now
}

func (t *progressThrottle) done(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.last, name)
}

// sameButMessages reports whether two condition lists differ at most in
// messages and transition times.
func sameButMessages(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || a[i].Status != b[i].Status || a[i].Reason != b[i].Reason || a[i].ObservedGeneration != b[i].ObservedGeneration {
			return false
		}
	}
	return true
}
