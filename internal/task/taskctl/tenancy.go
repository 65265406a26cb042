package taskctl

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/tenancy"
)

// ReasonNotGranted: the tenancy policy keeps a task off every node (its
// nodeName is not granted to its namespace, or no NodeGrant of the
// namespace allows its user, group or workingDir). The Task's status
// reason and condition reason, and its Event's reason.
const ReasonNotGranted = "NotGranted"

// ReasonGrantsNothing: the Event on a NodeGrant whose selectors do not
// parse; it grants nothing until fixed.
const ReasonGrantsNothing = "GrantsNothing"

// namespaceMeta is how the scheduler reads namespaces: their labels only
// (a NodeGrant's namespaceSelector), from a metadata-only informer.
func namespaceMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return m
}

// grantMatters: a grant's spec changed (its generation); its status and
// metadata do not grant anything.
func grantMatters(e event.UpdateEvent) bool {
	return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
}

// namespaceMatters: a namespace's labels can bring it under a grant's
// namespaceSelector or take it out.
func namespaceMatters(e event.UpdateEvent) bool {
	return !equality.Semantic.DeepEqual(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
}

// policy compiles the cluster's NodeGrants. A grant that does not compile
// grants nothing (tenancy fails closed); it is logged and gets a Warning
// Event once per generation.
func (s *Scheduler) policy(ctx context.Context) (*tenancy.Policy, error) {
	var list fleetv1.NodeGrantList
	if err := s.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list NodeGrants: %w", err)
	}
	p, errs := tenancy.Compile(list.Items)
	if len(errs) == 0 && len(s.badGrants) == 0 {
		return p, nil
	}
	// Which ones: Compile's errors name them, the Events need the objects.
	bad := map[types.UID]int64{}
	for i := range list.Items {
		g := &list.Items[i]
		_, gerrs := tenancy.Compile(list.Items[i : i+1])
		if len(gerrs) == 0 {
			continue
		}
		bad[g.UID] = g.Generation
		if s.badGrants[g.UID] == g.Generation {
			continue // told already
		}
		log.FromContext(ctx).Error(gerrs[0], "NodeGrant grants nothing until fixed", "NodeGrant", g.Name)
		if s.Recorder != nil {
			s.Recorder.Eventf(g.DeepCopy(), nil, corev1.EventTypeWarning, ReasonGrantsNothing, "Compile", "%s", gerrs[0].Error())
		}
	}
	s.badGrants = bad
	return p, nil
}

// accessOf is what each namespace of the due tasks is granted, under p.
// A namespace the cache does not hold (yet, or any more) is granted only
// what grants give it by name.
func (s *Scheduler) accessOf(ctx context.Context, p *tenancy.Policy, due []decision) (map[string]tenancy.Access, error) {
	out := map[string]tenancy.Access{}
	for i := range due {
		ns := due[i].task.Namespace
		if _, ok := out[ns]; ok {
			continue
		}
		m := namespaceMeta()
		if err := s.Client.Get(ctx, client.ObjectKey{Name: ns}, m); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("get Namespace %s: %w", ns, err)
		}
		out[ns] = p.For(ns, m.Labels)
	}
	return out, nil
}

// refused reports whether a create or update was refused for what it
// asks (admission: the tenancy webhook's Forbidden, a schema's Invalid):
// asking again at once gets the same answer, so the owner says why on its
// status and retries slowly.
func refused(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
}
