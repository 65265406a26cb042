package taskhub

// Reports bound to their node: a node connected to the hub forges reports
// of a task that runs on another node, at each point of the task's life.
// Both nodes are raw gRPC clients with real certificates, so that the test
// decides when the real node answers.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testenv"
)

// rawNode is a node registered through the real Register RPC, with its
// stream open, that sends only what the test tells it to.
type rawNode struct {
	t    *testing.T
	name string
	c    agentv1.AgentHubClient
	rev  uint64
	envs chan *agentv1.Envelope
}

// rawNode registers node with the fixture's hub and opens its stream,
// naming the features of a current agent.
func (f *fixture) rawNode(node string) *rawNode {
	f.t.Helper()
	return f.rawNodeWith(node, []string{protocol.FeatureDispatchBatch, taskwire.FeatureRunAs})
}

// rawNodeWith is rawNode whose stream names features (none: an agent
// older than any of them).
func (f *fixture) rawNodeWith(node string, features []string) *rawNode {
	t := f.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok.AutoApprove = true
	if err := bootstrap.Create(ctx, f.c, f.droverNS, tok); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(f.caPEM()) {
		t.Fatal("no CA certificate")
	}
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	resp, err := agentv1.NewAgentHubClient(dial(t, f.addr, cfg)).Register(ctx, &agentv1.RegisterRequest{Node: node, BootstrapToken: tok.String(), Csr: csr})
	if err != nil || resp.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED {
		t.Fatalf("register %s: %v %v %s", node, err, resp.GetResult(), resp.GetMessage())
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates = []tls.Certificate{cert}
	n := &rawNode{t: t, name: node, c: agentv1.NewAgentHubClient(dial(t, f.addr, cfg)), envs: make(chan *agentv1.Envelope, 64)}

	sctx, scancel := context.WithCancel(context.Background())
	stream, err := n.c.GetMessage(sctx, &agentv1.GetMessageRequest{Features: features})
	if err != nil {
		scancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			env, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case n.envs <- env:
			case <-sctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { scancel(); <-done })
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("node %s connected", node), func(context.Context) (bool, error) {
		return f.hub.Connected(node), nil
	})
	return n
}

func dial(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// report sends one work status at the node's next revision. The hub
// delivers (or drops) it before it answers.
func (n *rawNode) report(uid, phase, reason string, r taskwire.Report) {
	n.t.Helper()
	n.rev++
	n.send(protocol.NewStatus(n.name, n.rev, &agentv1.WorkStatus{Uid: uid, Phase: phase, Reason: reason, Message: r.Encode()}))
}

// state sends the node's whole state: uid at phase.
func (n *rawNode) state(uid, phase string) {
	n.t.Helper()
	n.rev++
	n.send(protocol.NewNodeState(n.name, n.rev, nil, []*agentv1.WorkStatus{{Uid: uid, Phase: phase}}))
}

func (n *rawNode) send(env *agentv1.Envelope) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := n.c.SendMessage(ctx, env)
	if err != nil || resp.GetDuplicate() || resp.GetFullSyncRequired() {
		n.t.Fatalf("node %s: SendMessage = %v, %v; want it applied", n.name, resp, err)
	}
}

// waitFor waits until the hub sends the node an envelope that has uid
// (in a Dispatch, a Snapshot or a Cancel, as kind says).
func (n *rawNode) waitFor(kind agentv1.Kind, uid string) {
	n.t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		select {
		case env := <-n.envs:
			if env.GetKind() != kind {
				continue
			}
			for _, u := range uidsIn(env) {
				if u == uid {
					return
				}
			}
		case <-timer.C:
			n.t.Fatalf("node %s got no %v of %s within %s", n.name, kind, uid, waitTimeout)
		}
	}
}

// uidsIn lists the work uids env carries: the items of a Dispatch or a
// Snapshot, the uid of a Cancel.
func uidsIn(env *agentv1.Envelope) []string {
	var uids []string
	switch env.GetKind() {
	case agentv1.Kind_KIND_DISPATCH:
		uids = append(uids, env.GetDispatch().GetItem().GetUid())
		for _, it := range env.GetDispatch().GetMore() {
			uids = append(uids, it.GetUid())
		}
	case agentv1.Kind_KIND_SNAPSHOT:
		for _, it := range env.GetSnapshot().GetItems() {
			uids = append(uids, it.GetUid())
		}
	case agentv1.Kind_KIND_CANCEL:
		uids = append(uids, env.GetCancel().GetUid())
	}
	return uids
}

// scheduleOn creates a task and, as the manager does, schedules attempt 1
// onto node.
func (f *fixture) scheduleOn(name, node string) (*batchv1.Task, string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	t := &batchv1.Task{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec:       batchv1.TaskSpec{Command: []string{"/bin/sleep", "600"}},
	}
	if err := f.c.Create(ctx, t); err != nil {
		f.t.Fatal(err)
	}
	t.Status = batchv1.TaskStatus{State: batchv1.TaskScheduled, Reason: batchv1.ReasonScheduled, NodeName: node, Attempt: 1}
	if err := f.c.Status().Update(ctx, t); err != nil {
		f.t.Fatal(err)
	}
	return t, taskwire.WorkID(string(t.UID), 1)
}

// waitSettled waits until the task is Running or has ended, and returns it:
// a forged end written before the real node's Running shows.
func (f *fixture) waitSettled(t *batchv1.Task) *batchv1.Task {
	f.t.Helper()
	var got batchv1.Task
	testenv.Eventually(f.t, waitTimeout, fmt.Sprintf("task %s is Running or ended", t.Name), func(ctx context.Context) (bool, error) {
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(t), &got); err != nil {
			return false, err
		}
		return got.Status.State == batchv1.TaskRunning || got.Status.State.Final(), nil
	})
	return &got
}

// foreign is how many reports the hub dropped as not the sender's.
func (f *fixture) foreign() float64 { return f.counter("drover_hub_reports_foreign_total") }

// endedFor is the work id whose end the dispatcher took as reported.
func (f *fixture) endedFor(uid types.UID) string {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	return f.d.ended[uid]
}

func started() taskwire.Report {
	return taskwire.Report{PID: 4242, StartTime: time.Now().Format(time.RFC3339Nano)}
}

func exited(code int32, out string) taskwire.Report {
	return taskwire.Report{ExitCode: &code, FinishTime: time.Now().Format(time.RFC3339Nano), OutputTail: out}
}

// TestForgedReportsWhileDispatching: reports of another node's task that
// arrive while its dispatch is in flight (sent, not yet reported on) are
// dropped; the real node's reports still move it along.
func TestForgedReportsWhileDispatching(t *testing.T) {
	f := start(t)
	owner, forger := f.rawNode(f.node+"-real"), f.rawNode(f.node+"-forger")
	task, work := f.scheduleOn("forged-dispatching", owner.name)
	owner.waitFor(agentv1.Kind_KIND_DISPATCH, work)

	forger.report(work, taskwire.PhaseSucceeded, "", exited(0, "forged output\n"))
	forger.state(work, taskwire.PhaseSucceeded)
	if n := f.foreign(); n != 2 {
		t.Errorf("drover_hub_reports_foreign_total = %v after two forged reports, want 2", n)
	}
	owner.report(work, taskwire.PhaseRunning, "", started())
	if got := f.waitSettled(task); got.Status.State != batchv1.TaskRunning {
		t.Fatalf("task is %s (%s, output %q), want Running: the forged end was taken", got.Status.State, got.Status.Reason, got.Status.OutputTail)
	}
	owner.report(work, taskwire.PhaseSucceeded, "", exited(0, "real output\n"))
	if got := f.waitState(task, batchv1.TaskCompleted); got.Status.OutputTail != "real output\n" {
		t.Errorf("output tail %q, want the real node's", got.Status.OutputTail)
	}
}

// TestForgedReportsWhileRunning: a running task ends only by its node's
// report.
func TestForgedReportsWhileRunning(t *testing.T) {
	f := start(t)
	owner, forger := f.rawNode(f.node+"-real"), f.rawNode(f.node+"-forger")
	task, work := f.scheduleOn("forged-running", owner.name)
	owner.waitFor(agentv1.Kind_KIND_DISPATCH, work)
	owner.report(work, taskwire.PhaseRunning, "", started())
	f.waitState(task, batchv1.TaskRunning)

	forger.report(work, taskwire.PhaseFailed, taskwire.ReasonExitCode, exited(1, "forged output\n"))
	forger.state(work, taskwire.PhaseFailed)
	if n := f.foreign(); n != 2 {
		t.Errorf("drover_hub_reports_foreign_total = %v after two forged reports, want 2", n)
	}
	owner.report(work, taskwire.PhaseSucceeded, "", exited(0, "real output\n"))
	got := f.waitState(task, batchv1.TaskCompleted)
	if got.Status.OutputTail != "real output\n" {
		t.Errorf("output tail %q, want the real node's", got.Status.OutputTail)
	}
}

// TestForgedCancelWhileDeleting: a deleted task's finalizer is released
// only when the node it runs on confirms the cancel; another node's
// Cancelled does not release it.
func TestForgedCancelWhileDeleting(t *testing.T) {
	f := start(t)
	owner, forger := f.rawNode(f.node+"-real"), f.rawNode(f.node+"-forger")
	task, work := f.scheduleOn("forged-deleting", owner.name)
	owner.waitFor(agentv1.Kind_KIND_DISPATCH, work)
	owner.report(work, taskwire.PhaseRunning, "", started())
	f.waitState(task, batchv1.TaskRunning)
	f.waitFinalizer(task)

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := f.c.Delete(ctx, task); err != nil {
		t.Fatal(err)
	}
	owner.waitFor(agentv1.Kind_KIND_CANCEL, work)
	forger.report(work, taskwire.PhaseCancelled, taskwire.ReasonCancelled, exited(143, ""))
	if n := f.foreign(); n != 1 {
		t.Errorf("drover_hub_reports_foreign_total = %v after a forged Cancelled, want 1", n)
	}
	if w := f.endedFor(task.UID); w != "" {
		t.Fatalf("the dispatcher took %s as ended on a forged Cancelled: the finalizer would be released while the process runs", w)
	}
	var got batchv1.Task
	if err := f.c.Get(ctx, client.ObjectKeyFromObject(task), &got); err != nil {
		t.Fatalf("task after the forged Cancelled: %v, want it still held by its finalizer", err)
	}
	if !controllerutil.ContainsFinalizer(&got, FinalizerCleanup) {
		t.Fatalf("finalizers %v after the forged Cancelled, want %s", got.Finalizers, FinalizerCleanup)
	}
	owner.report(work, taskwire.PhaseCancelled, taskwire.ReasonCancelled, exited(143, ""))
	f.waitGone(task)
}

// TestForgedEndBeforeDelete: a forged Succeeded of a running task does not
// count as its end, so deleting it later still sends the cancel to the
// node it runs on.
func TestForgedEndBeforeDelete(t *testing.T) {
	f := start(t)
	owner, forger := f.rawNode(f.node+"-real"), f.rawNode(f.node+"-forger")
	task, work := f.scheduleOn("forged-end", owner.name)
	owner.waitFor(agentv1.Kind_KIND_DISPATCH, work)
	owner.report(work, taskwire.PhaseRunning, "", started())
	f.waitState(task, batchv1.TaskRunning)
	f.waitFinalizer(task)

	forger.report(work, taskwire.PhaseSucceeded, "", exited(0, "forged output\n"))
	if n := f.foreign(); n != 1 {
		t.Errorf("drover_hub_reports_foreign_total = %v after a forged Succeeded, want 1", n)
	}
	if w := f.endedFor(task.UID); w != "" {
		t.Errorf("the dispatcher took %s as ended on a forged Succeeded", w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := f.c.Delete(ctx, task); err != nil {
		t.Fatal(err)
	}
	owner.waitFor(agentv1.Kind_KIND_CANCEL, work)
	owner.report(work, taskwire.PhaseCancelled, taskwire.ReasonCancelled, exited(143, ""))
	f.waitGone(task)
}

// TestReportsAfterReschedule: a task moved to another node has a new work
// id; the old node's reports of the old attempt are its own (and do not
// touch the new attempt), while its reports of the new attempt are forged.
func TestReportsAfterReschedule(t *testing.T) {
	f := start(t)
	first, second := f.rawNode(f.node+"-first"), f.rawNode(f.node+"-second")
	task, old := f.scheduleOn("rescheduled", first.name)
	first.waitFor(agentv1.Kind_KIND_DISPATCH, old)
	first.report(old, taskwire.PhaseRunning, "", started())
	running := f.waitState(task, batchv1.TaskRunning)

	// The manager gives up on the first node and schedules attempt 2 on
	// the second, recording attempt 1.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	// The hub writes the task too (its finalizer): retry on a conflict, as
	// the manager does.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(running), running); err != nil {
			return err
		}
		running.Status = batchv1.TaskStatus{State: batchv1.TaskScheduled, Reason: batchv1.ReasonScheduled, NodeName: second.name, Attempt: 2,
			History: []batchv1.TaskAttempt{{Attempt: 1, Node: first.name, State: batchv1.TaskFailed, Reason: "NodeLost"}}}
		return f.c.Status().Update(ctx, running)
	}); err != nil {
		t.Fatal(err)
	}
	next := taskwire.WorkID(string(task.UID), 2)
	second.waitFor(agentv1.Kind_KIND_DISPATCH, next)
	first.waitFor(agentv1.Kind_KIND_CANCEL, old)

	first.report(old, taskwire.PhaseCancelled, taskwire.ReasonCancelled, exited(143, ""))
	if n := f.foreign(); n != 0 {
		t.Errorf("drover_hub_reports_foreign_total = %v after the old node's report of its own attempt, want 0", n)
	}
	first.report(next, taskwire.PhaseSucceeded, "", exited(0, "forged output\n"))
	if n := f.foreign(); n != 1 {
		t.Errorf("drover_hub_reports_foreign_total = %v after the old node's report of the new attempt, want 1", n)
	}
	second.report(next, taskwire.PhaseRunning, "", started())
	if got := f.waitSettled(task); got.Status.State != batchv1.TaskRunning || got.Status.Attempt != 2 {
		t.Fatalf("task is %s at attempt %d (%s, output %q), want attempt 2 Running", got.Status.State, got.Status.Attempt, got.Status.Reason, got.Status.OutputTail)
	}
	second.report(next, taskwire.PhaseSucceeded, "", exited(0, "real output\n"))
	if got := f.waitState(task, batchv1.TaskCompleted); got.Status.OutputTail != "real output\n" || got.Status.Attempt != 2 {
		t.Errorf("attempt %d completed with output %q, want attempt 2 with the second node's", got.Status.Attempt, got.Status.OutputTail)
	}
}
