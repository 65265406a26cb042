package apps

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// testTimeout bounds every wait across processes (a loaded 2-core CI).
const testTimeout = 60 * time.Second

// TestMain: the test binary also stands in for drover-agent as the v1
// cgroup start shim and the log shim.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == cgroup.ShimArg {
		os.Exit(cgroup.RunShim(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == taskexec.LogShimArg {
		os.Exit(taskexec.RunLogShim(os.Args[2:]))
	}
	testkit.VerifyNoLeaksAfter(m, func() {
		if echo.dir != "" {
			os.RemoveAll(echo.dir)
		}
	})
}

// echo is examples/echo-session, built once for the package's tests (a
// build takes long on a loaded machine) where every user may run it.
var echo struct {
	once      sync.Once
	dir, path string
	err       error
}

// errCancelled stands for agent.ErrCancelled: the hub cancelled the item.
var errCancelled = errors.New("cancelled by the hub")

func cancelled(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errCancelled) }

// memStore is the agent DB's part the node uses: records and work phases.
type memStore struct {
	mu      sync.Mutex
	records map[string][]byte
	running map[string]bool
	phases  map[string]string
}

func newMemStore() *memStore {
	return &memStore{records: map[string][]byte{}, running: map[string]bool{}, phases: map[string]string{}}
}

func (s *memStore) SetRecord(_ context.Context, uid string, running bool, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if data != nil {
		s.records[uid] = data
	}
	s.running[uid] = running
	return nil
}

func (s *memStore) Record(_ context.Context, uid string) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.records[uid]
	return b, ok, nil
}

func (s *memStore) WorkPhase(_ context.Context, uid string) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.phases[uid]
	return p, ok, nil
}

func (s *memStore) setPhase(uid, phase string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phases[uid] = phase
}

// run is a work item run by the node, as the agent's work loop would.
type run struct {
	t      *testing.T
	uid    string
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	reps   []report
	wake   chan struct{}
	done   chan ending
	end    *ending
}

// start runs item uid on n, with the agent's stop as stop.
func start(t *testing.T, n *Node, stop context.Context, uid, typ string, spec any) *run {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(stop)
	r := &run{t: t, uid: uid, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan ending, 1)}
	go func() {
		phase, reason, msg := n.Run(ctx, uid, typ, b, func(_ context.Context, reason, message string) error {
			r.mu.Lock()
			r.reps = append(r.reps, report{reason, message})
			r.mu.Unlock()
			select {
			case r.wake <- struct{}{}:
			default:
			}
			return nil
		})
		r.done <- ending{phase, reason, msg}
	}()
	t.Cleanup(func() { cancel(errCancelled) })
	return r
}

// waitState waits for a report of state; it returns its message.
func (r *run) waitState(state string) string {
	r.t.Helper()
	deadline := time.After(testTimeout)
	seen := 0
	for {
		r.mu.Lock()
		reps := r.reps[seen:]
		seen = len(r.reps)
		r.mu.Unlock()
		for _, rep := range reps {
			if rep.reason == state {
				return rep.message
			}
		}
		select {
		case <-r.wake:
		case e := <-r.done:
			r.end = &e
			r.t.Fatalf("%s ended %s %s (%s) before it was %s; reports %v", r.uid, e.phase, e.reason, e.message, state, r.reports())
		case <-deadline:
			r.t.Fatalf("%s was not %s within %v; reports %v", r.uid, state, testTimeout, r.reports())
		}
	}
}

func (r *run) reports() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rep := range r.reps {
		out = append(out, rep.reason)
	}
	return out
}

// wait waits for the item's end.
func (r *run) wait() ending {
	r.t.Helper()
	if r.end != nil {
		return *r.end
	}
	select {
	case e := <-r.done:
		r.end = &e
		return e
	case <-time.After(testTimeout):
		r.t.Fatalf("%s did not end within %v; reports %v", r.uid, testTimeout, r.reports())
	}
	return ending{}
}

func instanceReport(t *testing.T, msg string) appwire.InstanceReport {
	t.Helper()
	r, err := appwire.DecodeInstanceReport(msg)
	if err != nil {
		t.Fatalf("instance report %q: %v", msg, err)
	}
	return r
}

func sessionReport(t *testing.T, msg string) appwire.SessionReport {
	t.Helper()
	r, err := appwire.DecodeSessionReport(msg)
	if err != nil {
		t.Fatalf("session report %q: %v", msg, err)
	}
	return r
}
