package scheduler

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// A multi-task group's instance (TaskGroup spec.tasks) is placed as one
// unit: its first task to be placed chooses a node with room for the whole
// instance, and every other task of it goes to that node. Inits run one at
// a time and before the others, so at any moment the instance needs the
// biggest init, or all mains and sidecars together: Reservation is the
// larger of the two, resource by resource.

// Member is one task of an instance, as far as its reservation goes.
type Member struct {
	Lifecycle batchv1.TaskLifecycle
	Resources corev1.ResourceList
}

// Reservation is what an instance of members holds on its node for as
// long as it runs: per resource, max(biggest init, sum of mains+sidecars).
func Reservation(members []Member) corev1.ResourceList {
	inits, rest := corev1.ResourceList{}, corev1.ResourceList{}
	for _, m := range members {
		for name, q := range m.Resources {
			if m.Lifecycle == batchv1.LifecycleInit {
				if cur, ok := inits[name]; !ok || q.Cmp(cur) > 0 {
					inits[name] = q.DeepCopy()
				}
				continue
			}
			sum := rest[name]
			sum.Add(q)
			rest[name] = sum
		}
	}
	out := corev1.ResourceList{}
	for name, q := range rest {
		out[name] = q
	}
	for name, q := range inits {
		if cur, ok := out[name]; !ok || q.Cmp(cur) > 0 {
			out[name] = q
		}
	}
	for name, q := range out {
		if q.IsZero() {
			delete(out, name)
		} else {
			out[name] = *resource.NewMilliQuantity(q.MilliValue(), q.Format)
		}
	}
	return out
}
