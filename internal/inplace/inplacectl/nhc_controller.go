package inplacectl

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace/healthcheck"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// AnnotationRemediation on a FleetNode names the remediation a
// NodeHealthCheck asked for (a built-in action, or "external:<kind>/<name>");
// the agent side or the external remediator acts on it. The controller
// removes it, and records AnnotationRemediatedAt, once the node is healthy
// again.
const AnnotationRemediation = "update.drover.io/remediation"

// HealthCheckReconciler reconciles NodeHealthChecks.
type HealthCheckReconciler struct{ Options }

// +kubebuilder:rbac:groups=update.drover.io,resources=nodehealthchecks,verbs=get;list;watch
// +kubebuilder:rbac:groups=update.drover.io,resources=nodehealthchecks/status,verbs=patch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes;fleetnodes/status,verbs=get;list;watch;patch

// SetupWithManager registers the controller: a check is reconciled when it
// or a node it selects changes, and when a verdict may change by time.
func (r *HealthCheckReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	toChecks := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var l updatev1.NodeHealthCheckList
		if err := r.Client.List(ctx, &l); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, h := range l.Items {
			if sel, err := metav1.LabelSelectorAsSelector(&h.Spec.Selector); err == nil && sel.Matches(labels.Set(o.GetLabels())) {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: h.Name}})
			}
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).Named("nodehealthcheck").
		For(&updatev1.NodeHealthCheck{}).
		Watches(&fleetv1.FleetNode{}, toChecks).
		Complete(r.generated())
}

// Reconcile implements reconcile.Reconciler.
func (r *HealthCheckReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

func (r *HealthCheckReconciler) generated() *HealthCheckManagerReconciler {
	return &HealthCheckManagerReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, h *updatev1.NodeHealthCheck) HealthCheckManagerImpl {
			return &nhcImpl{Options: r.Options, nhc: h}
		},
		Workflow: func(m *HealthCheckManager, _ *updatev1.NodeHealthCheck) ctrlkit.Action {
			return ctrlkit.Sequential(m.Decide(), m.MarkNodes(), m.Remediate(), m.UpdateStatus())
		},
		Observer: r.Observer,
	}
}

type nhcImpl struct {
	Options
	nhc    *updatev1.NodeHealthCheck
	nodes  map[string]*fleetv1.FleetNode
	result healthcheck.Result
	now    time.Time
}

var _ HealthCheckManagerImpl = (*nhcImpl)(nil)

// Decide implements HealthCheckManagerImpl.
func (i *nhcImpl) Decide(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	sel, err := metav1.LabelSelectorAsSelector(&i.nhc.Spec.Selector)
	if err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("health check "+i.nhc.Name+" selector", reconcile.TerminalError(err))
	}
	var l fleetv1.FleetNodeList
	if err := i.Client.List(ctx, &l, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list nodes", err)
	}
	i.now = i.Options.now()
	i.nodes = map[string]*fleetv1.FleetNode{}
	var in []healthcheck.Node
	for idx := range l.Items {
		n := &l.Items[idx]
		i.nodes[n.Name] = n
		hn := healthcheck.Node{Name: n.Name, Created: n.CreationTimestamp.Time, Initialized: n.Status.ConnectedTime != nil || n.Status.LastHeartbeatTime != nil || meta.IsStatusConditionTrue(n.Status.Conditions, fleetv1.ReadyCondition),
			Conditions: n.Status.Conditions, UpdateStatus: updatev1.UpdateStatus(n.Status.UpdateStatus)}
		if n.Status.UpdateStartTime != nil {
			hn.UpdateStarted = n.Status.UpdateStartTime.Time
		}
		if c := meta.FindStatusCondition(n.Status.Conditions, updatev1.InPlaceUpdateCondition); c != nil {
			hn.UpdateReason = c.Message
		}
		in = append(in, hn)
	}
	i.result, err = healthcheck.Evaluate(i.nhc.Spec, in, i.now)
	if err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("health check "+i.nhc.Name, reconcile.TerminalError(err))
	}
	return ctrlkit.NoRequeue()
}

// MarkNodes implements HealthCheckManagerImpl.
func (i *nhcImpl) MarkNodes(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	for _, v := range i.result.Nodes {
		n := i.nodes[v.Name]
		before := n.DeepCopy()
		msg := v.Message
		if msg == "" {
			msg = "checked by " + i.nhc.Name
		}
		changed := setCondition(&n.Status.Conditions, updatev1.HealthCheckSucceededCondition, boolStatus(v.Healthy), v.Reason, msg, n.Generation)
		if changed {
			if err := i.Client.Status().Patch(ctx, n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
				return requeueOnConflict(err)
			}
			if !v.Healthy {
				i.event(n, corev1.EventTypeWarning, v.Reason, fmt.Sprintf("health check %s: %s", i.nhc.Name, v.Message))
			}
		}
		if v.Healthy && !v.InUpdate && n.Annotations[AnnotationRemediation] != "" {
			// Remediation ended: record it, so that the node's in-place
			// update runs again (the seed's remediation note).
			before := n.DeepCopy()
			delete(n.Annotations, AnnotationRemediation)
			n.Annotations[AnnotationRemediatedAt] = i.now.UTC().Format(time.RFC3339)
			if err := i.Client.Patch(ctx, n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
				return requeueOnConflict(err)
			}
			i.event(n, corev1.EventTypeNormal, "Remediated", "healthy again after remediation; an unfinished in-place update runs again")
		}
	}
	return ctrlkit.NoRequeue()
}

// Remediate implements HealthCheckManagerImpl.
func (i *nhcImpl) Remediate(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	rem := i.nhc.Spec.Remediation
	if rem == nil || !i.result.Allowed {
		return ctrlkit.NoRequeue()
	}
	for _, v := range i.result.Nodes {
		n := i.nodes[v.Name]
		if v.Healthy || n.Annotations[AnnotationRemediation] != "" {
			continue
		}
		what, action := string(rem.Action), string(rem.Action)
		if rem.TemplateRef != nil {
			action = "External"
			if err := i.createRemediation(ctx, n, *rem.TemplateRef); err != nil {
				return ctrlkit.RequeueIfErrorAndWrap("remediate node "+n.Name, err)
			}
			what = "external:" + rem.TemplateRef.Kind + "/" + rem.TemplateRef.Name
		}
		before := n.DeepCopy()
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[AnnotationRemediation] = what
		if err := i.Client.Patch(ctx, n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return requeueOnConflict(err)
		}
		logger.Info("remediation requested", "FleetNode", n.Name, "remediation", what, "reason", v.Reason)
		i.Metrics.remediated(action)
		i.event(n, corev1.EventTypeWarning, "RemediationRequested", fmt.Sprintf("health check %s: %s (%s): %s", i.nhc.Name, what, v.Reason, v.Message))
	}
	return ctrlkit.NoRequeue()
}

// createRemediation makes an external remediation request from ref: an
// object of ref's kind without "Template", named after the node, with the
// template's spec.template.spec (Cluster API's external remediation).
func (i *nhcImpl) createRemediation(ctx context.Context, n *fleetv1.FleetNode, ref updatev1.ObjectRef) error {
	spec, err := templateSpec(ctx, i.Client, ref)
	if err != nil {
		return fmt.Errorf("remediation: %w", err)
	}
	r := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	r.SetGroupVersionKind(TaskGVK(ref))
	r.SetNamespace(ref.Namespace)
	r.SetName(n.Name)
	r.SetLabels(map[string]string{updatev1.LabelNode: n.Name})
	r.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(n, fleetv1.GroupVersion.WithKind("FleetNode"))})
	if err := i.Client.Create(ctx, r); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// UpdateStatus implements HealthCheckManagerImpl.
func (i *nhcImpl) UpdateStatus(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	r := i.result
	before := i.nhc.DeepCopy()
	st := &i.nhc.Status
	st.ExpectedNodes, st.CurrentHealthy, st.InUpdate, st.RemediationsAllowed = int32(r.Expected), int32(r.Healthy), int32(r.InUpdate), int32(r.RemediationsAllowed)
	st.UnhealthyNodes = nil
	for _, v := range r.Nodes {
		if !v.Healthy && len(st.UnhealthyNodes) < 32 {
			st.UnhealthyNodes = append(st.UnhealthyNodes, v.Name)
		}
	}
	setCondition(&st.Conditions, updatev1.RemediationAllowedCondition, boolStatus(r.Allowed), r.Reason, r.Why, i.nhc.Generation)
	st.ObservedGeneration = i.nhc.Generation
	if err := i.Client.Status().Patch(ctx, i.nhc, client.MergeFrom(before)); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("patch health check status", client.IgnoreNotFound(err))
	}
	if r.NextCheck.IsZero() {
		return ctrlkit.NoRequeue()
	}
	// A second late, so that the deadline has passed when it runs.
	return ctrlkit.RequeueAfter(r.NextCheck.Sub(i.now) + time.Second)
}
