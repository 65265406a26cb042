package appctl

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
)

// writeStatus writes the Application's status when it changed.
func (c *Controller) writeStatus(ctx context.Context, v *view, d Decision, res *applied, now time.Time) error {
	app := v.app
	st := app.Status.DeepCopy()
	st.ObservedGeneration = app.Generation
	st.Instances, st.Nodes = serverlessv1.InstanceCounts{}, 0
	for node, s := range v.slices {
		if len(s.Spec.Instances) > 0 {
			st.Nodes++
		}
		reported := statusByName(s)
		lost := nodeLost(v.nodes[node])
		for _, in := range s.Spec.Instances {
			state := serverlessv1.InstancePending
			if r := reported[in.Name]; r != nil && r.State != "" {
				state = r.State
			}
			delete(reported, in.Name)
			count(&st.Instances, state)
		}
		if !lost {
			for _, r := range reported {
				if r.State != serverlessv1.InstanceTerminated {
					count(&st.Instances, serverlessv1.InstanceTerminating) // taken out, stopping
				}
			}
		}
	}
	st.Sessions = serverlessv1.SessionCounts{}
	for _, s := range v.sessions {
		switch p := s.Status.Phase; {
		case p.Final():
			st.Sessions.Terminated++
		case p.Open():
			st.Sessions.Open++
		case p == serverlessv1.SessionEvacuating || p == serverlessv1.SessionTerminating:
			st.Sessions.Closing++
		case s.Spec.InstanceName == "":
			if _, ok := res.bound[s.Name]; ok {
				st.Sessions.Starting++
			} else if _, ok := res.noCapacity[s.Name]; ok {
				st.Sessions.Terminated++
			} else {
				st.Sessions.Pending++
			}
		default:
			st.Sessions.Starting++
		}
	}
	gen := app.Generation
	switch {
	case res.unplaced > 0:
		reason := ReasonUnschedulable
		if res.denied {
			reason = ReasonNotGranted
		}
		old := meta.FindStatusCondition(st.Conditions, serverlessv1.ConditionSchedulable)
		if c.rec != nil && (old == nil || old.Status != metav1.ConditionFalse || old.Message != res.message) {
			c.rec.Eventf(app, nil, corev1.EventTypeWarning, ReasonFailedScheduling, "Schedule", "%d instance(s) fit nowhere: %s", res.unplaced, res.message)
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: serverlessv1.ConditionSchedulable, Status: metav1.ConditionFalse,
			Reason: reason, Message: res.message, ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)})
	case len(d.Add) > 0 || d.Missing == 0 || meta.FindStatusCondition(st.Conditions, serverlessv1.ConditionSchedulable) == nil:
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: serverlessv1.ConditionSchedulable, Status: metav1.ConditionTrue,
			Reason: ReasonPlaced, Message: "new instances find a granted, ready node with room", ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)})
	}
	ready := metav1.Condition{Type: serverlessv1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonInstancesReady,
		ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)}
	held := st.Instances.Total - st.Instances.Terminating
	switch {
	case d.Missing > 0 || st.Instances.Creating > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonScaling
		if res.unplaced > 0 {
			ready.Reason = ReasonUnschedulable
			if res.denied {
				ready.Reason = ReasonNotGranted
			}
		}
		ready.Message = fmt.Sprintf("%d instance(s) held, %d starting, %d more wanted", held, st.Instances.Creating, d.Missing)
	default:
		ready.Message = fmt.Sprintf("%d instance(s) held (%d standby)", held, st.Instances.Standby)
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	if equality.Semantic.DeepEqual(st, &app.Status) {
		return nil
	}
	u := app.DeepCopy()
	u.Status = *st
	if err := c.client.Status().Update(ctx, u); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // the change brings the reconcile back
		}
		return fmt.Errorf("update Application %s/%s status: %w", app.Namespace, app.Name, err)
	}
	return nil
}

func count(c *serverlessv1.InstanceCounts, s serverlessv1.InstanceState) {
	switch s {
	case serverlessv1.InstanceTerminated:
		return
	case serverlessv1.InstanceStandby:
		c.Standby++
	case serverlessv1.InstanceIdle:
		c.Idle++
	case serverlessv1.InstanceActivating, serverlessv1.InstanceRunning:
		c.Serving++
	case serverlessv1.InstanceEvacuating, serverlessv1.InstanceTerminating:
		c.Terminating++
	default:
		c.Creating++
	}
	c.Total++
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
