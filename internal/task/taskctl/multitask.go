package taskctl

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/kname"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// A multi-task group (spec.tasks) has instances instead of tasks: count of
// them, or one per matching node. Each instance is one Task per spec.tasks
// entry, named <group>-<key>-<name> and labelled with the instance; the
// mine map of a groupRun then holds them under "<key>/<name>". The
// sequencing of an instance is stepInstance's (sequence.go); the scheduler
// places an instance's tasks together (instances.go).

// multi reports whether g is a multi-task group.
func multi(g *batchv1.TaskGroup) bool { return g != nil && len(g.Spec.Tasks) > 0 }

// memberKey is the key of task member of instance inst in groupRun.mine.
func memberKey(inst, member string) string { return inst + "/" + member }

// instanceKey is the instance part of a mine key.
func instanceKey(k string) string {
	if i := strings.LastIndexByte(k, '/'); i >= 0 {
		return k[:i]
	}
	return k
}

// specsOf are the task specs of g: its template's, or each of its tasks'.
func specsOf(g *batchv1.TaskGroup) []*batchv1.TaskSpec {
	if !multi(g) {
		return []*batchv1.TaskSpec{&g.Spec.Template.Spec}
	}
	out := make([]*batchv1.TaskSpec, len(g.Spec.Tasks))
	for i := range g.Spec.Tasks {
		out[i] = &g.Spec.Tasks[i].Spec
	}
	return out
}

// memberTaskName is <group>-<key>-<member>, with key hashed when that
// would be over 253 characters (a long node name).
func memberTaskName(group, key, member string) string {
	if name := group + "-" + key + "-" + member; len(name) <= 253 {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	sum := strconv.FormatUint(h.Sum64(), 36)
	if room := 253 - len(group) - len(member) - 2; len(sum) > room {
		sum = sum[:max(room, 1)]
	}
	return group + "-" + sum + "-" + member
}

// newMember is task def of instance key of group g.
func newMember(g *batchv1.TaskGroup, key string, def *batchv1.GroupTask, gated bool, scheme *runtime.Scheme) (*batchv1.Task, error) {
	labels := maps.Clone(def.Metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[batchv1.LabelTaskGroup] = kname.LabelValue(g.Name)
	if j := g.Labels[batchv1.LabelFleetJob]; j != "" {
		labels[batchv1.LabelFleetJob] = j
	}
	labels[batchv1.LabelInstance] = kname.LabelValue(g.Name + "-" + key)
	labels[batchv1.LabelMember] = def.Name
	labels[batchv1.LabelLifecycle] = string(def.Role())
	spec := def.Spec.DeepCopy()
	if g.Spec.PerNode {
		labels[batchv1.LabelNode] = kname.LabelValue(key)
		spec.NodeName = key
	} else {
		labels[batchv1.LabelIndex] = key
	}
	if gated {
		spec.SchedulingGates = append(spec.SchedulingGates, gateInit)
	}
	t := &batchv1.Task{
		ObjectMeta: metav1.ObjectMeta{Name: memberTaskName(g.Name, key, def.Name), Namespace: g.Namespace, Labels: labels,
			Annotations: maps.Clone(def.Metadata.Annotations)},
		Spec: *spec,
	}
	return t, controllerutil.SetControllerReference(g, t, scheme)
}

// memberKeyOf is t's key in multi-task group g ("<instance>/<member>"),
// and whether its member is one of g's tasks.
func memberKeyOf(g *batchv1.TaskGroup, t *batchv1.Task, inst string, instOK bool) (string, bool) {
	m := t.Labels[batchv1.LabelMember]
	ok := slices.ContainsFunc(g.Spec.Tasks, func(d batchv1.GroupTask) bool { return d.Name == m })
	return memberKey(inst, m), instOK && ok && m != ""
}

// step decides instance inst from its tasks in w.mine and w.terminating.
func (w *groupRun) step(inst string) instanceStep {
	obs := map[string]memberObs{}
	for _, d := range w.group.Spec.Tasks {
		k := memberKey(inst, d.Name)
		o := memberObs{terminating: w.terminating[k]}
		if t := w.mine[k]; t != nil {
			o.exists, o.state, o.gated = true, countedState(t), slices.Contains(t.Spec.SchedulingGates, gateInit)
			if o.state == "" {
				o.state = batchv1.TaskPending
			}
		}
		obs[d.Name] = o
	}
	return stepInstance(w.group.Spec.Tasks, obs)
}

// instanceDone reports whether instance (or task) k has ended.
func (w *groupRun) instanceDone(k string) bool {
	if !multi(w.group) {
		t := w.mine[k]
		return t != nil && t.Status.State.Final()
	}
	return w.step(k).state.Final()
}

// createMembers makes, gates and stops the tasks of each instance as its
// step says.
func (w *groupRun) createMembers(ctx context.Context) (reconcile.Result, error) {
	g := w.group
	defs := map[string]*batchv1.GroupTask{}
	for i := range g.Spec.Tasks {
		defs[g.Spec.Tasks[i].Name] = &g.Spec.Tasks[i]
	}
	for _, inst := range w.want {
		s := w.step(inst)
		// Gated tasks first: when the scheduler sees the instance's first
		// runnable task, it sees the rest of the instance too, and so
		// reserves room for all of it.
		names := slices.SortedFunc(maps.Keys(s.create), func(a, b string) int {
			if s.create[a] != s.create[b] {
				if s.create[a] {
					return -1
				}
				return 1
			}
			return strings.Compare(a, b)
		})
		for _, name := range names {
			t, err := newMember(g, inst, defs[name], s.create[name], w.r.Client.Scheme())
			if err != nil {
				return ctrlkit.RequeueIfErrorAndWrap("owner reference", err)
			}
			err = w.r.Client.Create(ctx, t)
			switch {
			case apierrors.IsAlreadyExists(err):
				w.stale.Store(true)
			case refused(err):
				w.refused = append(w.refused, refusal{kind: "Task", name: t.Name, err: err})
			case err != nil:
				return ctrlkit.RequeueIfErrorAndWrap("create Task "+t.Name, err)
			default:
				w.mine[memberKey(inst, name)] = t
			}
		}
		for _, name := range s.ungate {
			t := w.mine[memberKey(inst, name)].DeepCopy()
			t.Spec.SchedulingGates = slices.DeleteFunc(t.Spec.SchedulingGates, func(s string) bool { return s == gateInit })
			if err := w.r.Client.Update(ctx, t); err != nil {
				if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
					w.stale.Store(true)
					continue
				}
				return ctrlkit.RequeueIfErrorAndWrap("start Task "+t.Name, err)
			}
			log.FromContext(ctx).V(1).Info("task's turn came", "Task", t.Name, "instance", inst)
		}
		for _, name := range s.stop {
			t := w.mine[memberKey(inst, name)]
			deleted, err := deleteDependent(ctx, w.r.Client, w.r.APIReader, t, g.UID)
			if err != nil {
				return ctrlkit.RequeueIfErrorAndWrap("stop Task "+t.Name, err)
			}
			if !deleted || w.r.Recorder == nil {
				continue
			}
			if s.stopReason == batchv1.ReasonSidecarStopped {
				w.r.Recorder.Eventf(g, nil, corev1.EventTypeNormal, batchv1.ReasonSidecarStopped, "Stop",
					"stopped sidecar task %s of instance %s: every main task ended", t.Name, inst)
			} else {
				w.r.Recorder.Eventf(g, nil, corev1.EventTypeWarning, batchv1.ReasonInitFailed, "Stop",
					"instance %s: %s; task %s will not start", inst, s.message, t.Name)
			}
		}
	}
	return ctrlkit.NoRequeue()
}

// memberStatus is the multi-task part of the group's status: instance
// counts (c), each task's progress and the TASKS column, and the failed
// instances' reasons (the first one's message).
func (w *groupRun) memberStatus(c *batchv1.TaskCounts) (tasks []batchv1.GroupTaskStatus, prog, failReason, failMsg string) {
	g := w.group
	tasks = make([]batchv1.GroupTaskStatus, len(g.Spec.Tasks))
	for i := range g.Spec.Tasks {
		tasks[i] = batchv1.GroupTaskStatus{Name: g.Spec.Tasks[i].Name, Lifecycle: g.Spec.Tasks[i].Role()}
	}
	ended, all := 0, 0
	for _, inst := range w.want {
		s := w.step(inst)
		state := s.state
		if w.expired && !state.Final() {
			state = batchv1.TaskFailed
		}
		addState(c, state)
		if state == batchv1.TaskFailed && failMsg == "" && s.message != "" {
			failReason, failMsg = s.reason, fmt.Sprintf("instance %s: %s", inst, s.message)
		}
		for i := range tasks {
			all++
			switch s.members[tasks[i].Name] {
			case progActive:
				tasks[i].Active++
			case progCompleted:
				tasks[i].Completed++
				ended++
			case progFailed:
				tasks[i].Failed++
				ended++
			case progStopped:
				tasks[i].Stopped++
				ended++
			default:
				tasks[i].Waiting++
			}
		}
	}
	return tasks, fmt.Sprintf("%d/%d", ended, all), failReason, failMsg
}
