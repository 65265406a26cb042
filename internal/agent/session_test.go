package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

// sessionTimeout bounds a session that must end by itself.
const sessionTimeout = testkit.DefaultTimeout

// quietHub is an AgentHubClient whose stream never breaks by itself, as an
// MQTT stream whose hub ended the session without a word: it sends a
// NodeConfiguration (unless mute), then nothing until its context ends.
// It refuses heartbeats as a hub does once the session is gone.
type quietHub struct {
	fakeHub
	mute bool
}

func (q *quietHub) GetMessage(ctx context.Context, _ *agentv1.GetMessageRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.Envelope], error) {
	s := &quietStream{ctx: ctx, in: make(chan *agentv1.Envelope, 1)}
	if !q.mute {
		s.in <- protocol.NewNodeConfiguration("n1", &agentv1.NodeConfiguration{Hub: "h"})
	}
	return s, nil
}

func (q *quietHub) SendMessage(ctx context.Context, env *agentv1.Envelope, opts ...grpc.CallOption) (*agentv1.SendResponse, error) {
	if env.GetKind() == agentv1.Kind_KIND_HEARTBEAT {
		return nil, status.Error(codes.FailedPrecondition, "node n1 has no open stream on hub h; open GetMessage first")
	}
	return q.fakeHub.SendMessage(ctx, env, opts...)
}

type quietStream struct {
	grpc.ClientStream
	ctx context.Context
	in  chan *agentv1.Envelope
}

func (s *quietStream) Recv() (*agentv1.Envelope, error) {
	select {
	case env := <-s.in:
		return env, nil
	case <-s.ctx.Done():
		return nil, status.FromContextError(s.ctx.Err()).Err()
	}
}

func (s *quietStream) Header() (metadata.MD, error) { return nil, nil }
func (s *quietStream) Context() context.Context     { return s.ctx }

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// testIdentity is a saved identity for node n1.
func testIdentity(t *testing.T) store.Identity {
	t.Helper()
	ca, err := pki.NewCA("test-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, csr, err := pki.NewKeyAndCSR("n1")
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignClientCSR(csr, "n1", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return store.Identity{Node: "n1", KeyPEM: keyPEM, CertPEM: pki.EncodeCert(der), CAPEM: ca.CertPEM, Hub: "h:1"}
}

// runSession runs one session against hub and returns how it ended, or
// fails the test when it has not ended within sessionTimeout.
func runSession(t *testing.T, a *Agent, hub agentv1.AgentHubClient) error {
	t.Helper()
	a.conn = make(chan struct{})
	a.opts.Connect = func(context.Context, string, *tls.Config) (agentv1.AgentHubClient, io.Closer, error) {
		return hub, nopCloser{}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // ends a session that hangs, after the test failed
	if err := a.useIdentity(testIdentity(t)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.session(ctx, "h:1") }()
	select {
	case err := <-done:
		return err
	case <-time.After(sessionTimeout):
		t.Fatalf("the session has not ended %v after it could not go on", sessionTimeout)
		return nil
	}
}

// TestSessionEndsWhenAHeartbeatFails: a refused (or unanswered) heartbeat
// ends the session even when the stream does not break by itself, as over
// MQTT, so that the agent says hello again.
func TestSessionEndsWhenAHeartbeatFails(t *testing.T) {
	a := newTestAgent(t, nil)
	a.heartbeat = 50 * time.Millisecond
	err := runSession(t, a, &quietHub{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "heartbeat") {
		t.Fatalf("session ended with %v, want the heartbeat's FailedPrecondition", err)
	}
}

// TestSessionEndsWhenTheHelloIsNotAnswered: a session whose hub never sends
// its first envelope ends after helloTimeout.
func TestSessionEndsWhenTheHelloIsNotAnswered(t *testing.T) {
	a := newTestAgent(t, nil)
	clk := clocktest.New(time.Time{})
	a.opts.Clock = clk
	stepped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.DefaultTimeout)
		defer cancel()
		// The session's one timer before the hub answers: the hello's.
		err := clk.BlockUntilWaiters(ctx, 1)
		clk.Step(helloTimeout)
		stepped <- err
	}()
	err := runSession(t, a, &quietHub{mute: true})
	if err := <-stepped; err != nil {
		t.Fatalf("the session never waited for the hub's answer: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "no answer to the session's hello") {
		t.Fatalf("session ended with %v, want no answer to the hello", err)
	}
}

// TestRegistrationKeySurvivesARestart: an agent that waits for approval and
// restarts asks again with the same key, which the hub bound the node to.
func TestRegistrationKeySurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{opts: Options{Node: "k1", StateDir: dir}, log: slog.New(slog.DiscardHandler)}
	key1, csr1, err := a.registrationKey()
	if err != nil {
		t.Fatal(err)
	}
	key2, csr2, err := a.registrationKey()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(key1, key2) {
		t.Error("a second start made a new key")
	}
	fp1, err1 := pki.CSRKeyFingerprint(csr1)
	fp2, err2 := pki.CSRKeyFingerprint(csr2)
	if err1 != nil || err2 != nil || fp1 != fp2 {
		t.Errorf("requests for different keys: %s, %s (%v, %v)", fp1, fp2, err1, err2)
	}
	if st, err := os.Stat(filepath.Join(dir, "registration.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("registration.key: %v, %v; want mode 0600", st, err)
	}
}
