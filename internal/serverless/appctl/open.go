package appctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/kname"
)

// Open opens a session of the Application app in namespace in-process (a
// session API server's path): it picks the instance as the reconcile of
// unbound sessions does, adding an active instance to a slice when none
// has room (the cold path), and creates the ApplicationSession already
// bound, in one write. The error wraps ErrApplicationNotFound,
// ErrApplicationIsDaemon or ErrNoCapacity when the session cannot be
// opened; nothing is created then.
func (c *Controller) Open(ctx context.Context, namespace, app string, data map[string]string, openTimeout *time.Duration) (*serverlessv1.ApplicationSession, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A slice that changed meanwhile (deleted, or made by another
	// manager) is read again, a few times.
	for try := 0; ; try++ {
		s, retry, err := c.open(ctx, namespace, app, data, openTimeout)
		if !retry || try == 2 {
			if errors.Is(err, ErrNoCapacity) {
				sessionsEnded.WithLabelValues(serverlessv1.ReasonNoCapacity).Inc()
			}
			return s, err
		}
	}
}

func (c *Controller) open(ctx context.Context, namespace, app string, data map[string]string, openTimeout *time.Duration) (*serverlessv1.ApplicationSession, bool, error) {
	now := c.clock.Now()
	v, err := c.load(ctx, types.NamespacedName{Namespace: namespace, Name: app}, now)
	if err != nil {
		return nil, false, err
	}
	if v.app == nil {
		return nil, false, fmt.Errorf("%w: application %s not found in namespace %s", ErrApplicationNotFound, app, namespace)
	}
	if v.app.Spec.Mode == serverlessv1.ModeDaemon {
		return nil, false, fmt.Errorf("%w: application %s runs as a daemon and serves no sessions", ErrApplicationIsDaemon, app)
	}
	// Only this session: the unbound ones of the API wait for the
	// reconcile, in their order, and the pool's refill is its too.
	const key = "\x00open"
	d := decide(c.input(v, now, []Pending{{Key: key, Created: now}}))
	var mine []Binding
	for _, b := range d.Bind {
		if b.Session == key {
			mine = append(mine, b)
		}
	}
	only := Decision{Bind: mine, Missing: d.Missing, Want: d.Want}
	if len(mine) == 1 && mine[0].Instance == "" {
		only.Add = []Add{d.Add[mine[0].NewIndex]}
		only.Bind[0].NewIndex = 0
	}
	res, err := c.apply(ctx, v, only, now)
	if err != nil {
		return nil, false, err
	}
	p, ok := res.bound[key]
	if !ok {
		msg := fmt.Sprintf("every instance of application %s is serving its %d session(s) and it holds maxInstances (%d)",
			app, max(v.app.Spec.Scaling.SessionsPerInstance, 1), v.app.Spec.Scaling.MaxInstances)
		if m := res.noCapacity[key]; m != "" {
			msg = m
		}
		if res.retry {
			return nil, true, fmt.Errorf("%w: the instances of application %s changed meanwhile; try again", ErrNoCapacity, app)
		}
		return nil, false, fmt.Errorf("%w: %s", ErrNoCapacity, msg)
	}
	s := &serverlessv1.ApplicationSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: trimName(kname.LabelValue(app)[:min(len(kname.LabelValue(app)), 50)]) + "-",
			Labels:      map[string]string{serverlessv1.LabelApplication: kname.LabelValue(app)},
			Annotations: map[string]string{AnnotationBoundTime: now.UTC().Format(time.RFC3339Nano)},
			Finalizers:  []string{serverlessv1.FinalizerSession}},
		Spec: serverlessv1.ApplicationSessionSpec{Application: app, Data: data, InstanceName: p.inst.Name, NodeName: p.node},
	}
	if openTimeout != nil {
		s.Spec.OpenTimeout = &metav1.Duration{Duration: *openTimeout}
	}
	if err := c.client.Create(ctx, s); err != nil {
		return nil, false, fmt.Errorf("create ApplicationSession of %s/%s: %w", namespace, app, err)
	}
	c.notes[client.ObjectKeyFromObject(s)] = sessionNote{uid: s.UID, instance: p.inst.Name, node: p.node, created: true, at: now}
	sessionsBound.Inc()
	return s, false, nil
}
