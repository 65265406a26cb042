package nodejobhub_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

func admittedEntry(node string) opsv1.NodeTaskStatus {
	now := metav1.NowMicro()
	return opsv1.NodeTaskStatus{NodeName: node, Phase: opsv1.NodeTaskPhaseInProgress, Reason: "dispatched to hub x", UpdateTime: &now}
}

func urlUpgrade(name string, nodes ...string) *opsv1.NodeUpgradeJob {
	return &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: opsv1.NodeUpgradeJobSpec{
		NodeNames: nodes, Version: "v1.2.3", Artifact: opsv1.AgentArtifact{URL: "https://example.com/agent", SHA256: digest}}}
}

// A dispatch the hub cannot send fails the node at once, saying so; the
// manager then frees its slot.
func TestAFailedSendFailsTheNode(t *testing.T) {
	testenv.Require(t, env)
	_, h, _ := start(t, 0)
	h.mu.Lock()
	h.connected["s1"] = true
	h.failSend["s1"] = errors.New("stream closed")
	h.mu.Unlock()
	job := urlUpgrade("exec-send-fails", "s1")
	s := jobWithSlice(t, job, admittedEntry("s1"))
	testenv.Eventually(t, waitTimeout, "s1 failed", func(context.Context) (bool, error) {
		got := sliceEntry(t, s.Name, "s1")
		if got.Phase != opsv1.NodeTaskPhaseFailure {
			return false, fmt.Errorf("entry %+v", got)
		}
		if !strings.Contains(got.Reason, "failed to send") || !strings.Contains(got.Reason, "stream closed") {
			t.Errorf("reason = %q; want it to say the send failed and why", got.Reason)
		}
		return true, nil
	})
}

// An imageSecretRef that cannot be read or decoded fails the nodes with a
// reason naming the Secret.
func TestAnUnusableSecretFailsTheNodes(t *testing.T) {
	testenv.Require(t, env)
	_, h, _ := start(t, 0)
	h.mu.Lock()
	h.connected["p1"], h.connected["p2"] = true, true
	h.mu.Unlock()
	ctx := context.Background()
	bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-docker", Namespace: "default"},
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte("not json")}}
	if err := env.Client.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ node, secret, want string }{
		{"p1", "missing", "imageSecretRef default/missing"},
		{"p2", "not-docker", "imageSecretRef default/not-docker"},
	} {
		job := &opsv1.ImagePrePullJob{ObjectMeta: metav1.ObjectMeta{Name: "exec-secret-" + tc.secret}, Spec: opsv1.ImagePrePullJobSpec{
			NodeNames: []string{tc.node}, Images: []string{"nginx"}, ImageSecretRef: &corev1.SecretReference{Namespace: "default", Name: tc.secret}}}
		s := jobWithSlice(t, job, admittedEntry(tc.node))
		testenv.Eventually(t, waitTimeout, tc.node+" failed naming the Secret", func(context.Context) (bool, error) {
			got := sliceEntry(t, s.Name, tc.node)
			if got.Phase != opsv1.NodeTaskPhaseFailure || !strings.Contains(got.Reason, tc.want) {
				return false, fmt.Errorf("entry %+v", got)
			}
			return true, nil
		})
		if h.has(&h.dispatched, tc.node+"/"+string(job.UID)+"/"+nodejobwire.TypePrePull) {
			t.Errorf("%s: dispatched without its credentials", tc.node)
		}
	}
}

// Reports whose slice write fails with something other than a conflict
// are kept and written later.
func TestAFailedWriteKeepsItsReports(t *testing.T) {
	testenv.Require(t, env)
	var failing atomic.Int32
	failing.Store(3)
	e, h, _ := startWith(t, 0, func(c client.Client) client.Client {
		return failingUpdates{Client: c, fail: func(obj client.Object) error {
			if _, ok := obj.(*opsv1.NodeTaskSlice); ok && failing.Add(-1) >= 0 {
				return apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
			}
			return nil
		}}
	})
	h.mu.Lock()
	h.connected["w1"] = true
	h.mu.Unlock()
	job := urlUpgrade("exec-write-fails", "w1")
	s := jobWithSlice(t, job, admittedEntry("w1"))
	uid := string(job.UID)
	testenv.Eventually(t, waitTimeout, "w1 dispatched", func(context.Context) (bool, error) {
		return h.has(&h.dispatched, "w1/"+uid+"/"+nodejobwire.TypeUpgrade), nil
	})
	up := nodejobwire.Report{Action: nodejobwire.Upgrade, Success: true, Time: time.Now(), CurrentVersion: "v1.2.3"}
	e.WorkStatus(context.Background(), "w1", &agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseSucceeded, Reason: up.Action, Message: nodejobwire.EncodeReport(up)})
	testenv.Eventually(t, waitTimeout, "w1 Successful after the failed writes", func(context.Context) (bool, error) {
		got := sliceEntry(t, s.Name, "w1")
		if got.Phase != opsv1.NodeTaskPhaseSuccessful {
			return false, fmt.Errorf("entry %+v (failures left %d)", got, failing.Load())
		}
		return true, nil
	})
}

// An action the agent's flow does not have is refused: it never reaches
// the node's action flow.
func TestUnknownActionsAreRefused(t *testing.T) {
	testenv.Require(t, env)
	e, h, _ := start(t, 0)
	h.mu.Lock()
	h.connected["u1"] = true
	h.mu.Unlock()
	job := urlUpgrade("exec-unknown-action", "u1")
	s := jobWithSlice(t, job, admittedEntry("u1"))
	uid := string(job.UID)
	testenv.Eventually(t, waitTimeout, "u1 dispatched", func(context.Context) (bool, error) {
		return h.has(&h.dispatched, "u1/"+uid+"/"+nodejobwire.TypeUpgrade), nil
	})
	ctx := context.Background()
	for _, r := range []nodejobwire.Report{
		{Action: "Reboot", Success: true, Time: time.Now()},
		{Action: nodejobwire.Pull, Success: true, Time: time.Now()}, // a pre-pull's, not an upgrade's
		{Action: nodejobwire.Dispatch, Success: false, Reason: "forged", Time: time.Now()},
	} {
		e.WorkStatus(ctx, "u1", &agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseFailed, Reason: r.Action, Message: nodejobwire.EncodeReport(r)})
	}
	ok := nodejobwire.Report{Action: nodejobwire.Check, Success: false, Reason: "disk full", Time: time.Now()}
	e.WorkStatus(ctx, "u1", &agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseFailed, Reason: ok.Action, Message: nodejobwire.EncodeReport(ok)})
	testenv.Eventually(t, waitTimeout, "u1 failed at Check", func(context.Context) (bool, error) {
		got := sliceEntry(t, s.Name, "u1")
		if got.Phase != opsv1.NodeTaskPhaseFailure {
			return false, fmt.Errorf("entry %+v", got)
		}
		if got.Action != nodejobwire.Check || len(got.ActionFlow) != 1 || got.ActionFlow[0].Action != nodejobwire.Check {
			t.Errorf("entry %+v; want only Check in its flow", got)
		}
		return true, nil
	})
}

// failingUpdates fails the updates fail returns an error for.
type failingUpdates struct {
	client.Client
	fail func(client.Object) error
}

func (f failingUpdates) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := f.fail(obj); err != nil {
		return err
	}
	return f.Client.Update(ctx, obj, opts...)
}
