package sessionsvc

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/pkg/sessionsdk"
)

const testTimeout = 60 * time.Second

// event is one callback the Handler got.
type event struct {
	instance, session string
	msg               actor.Message
}

// recorder is a Handler that keeps what it got, for waits.
type recorder struct {
	mu  sync.Mutex
	evs []event
	ch  chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) handle(instance, session string, msg actor.Message) {
	r.mu.Lock()
	r.evs = append(r.evs, event{instance, session, msg})
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// wait waits for the event want.
func (r *recorder) wait(t *testing.T, want event) {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		r.mu.Lock()
		for _, e := range r.evs {
			if reflect.DeepEqual(e, want) {
				r.mu.Unlock()
				return
			}
		}
		got := append([]event{}, r.evs...)
		r.mu.Unlock()
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("no %+v within %v; got %+v", want, testTimeout, got)
		}
	}
}

// shortDir is a dir with a short path (a unix socket path has 107 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ss-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// app is a sessionsdk.Handler that says Ready and Evacuated/Closed at once.
type app struct{ started chan sessionsdk.Session }

func (a *app) StartSession(ctx context.Context, c *sessionsdk.Client, s sessionsdk.Session) {
	a.started <- s
	_ = c.Ready(ctx, s.Name)
}

func (a *app) CloseSession(ctx context.Context, c *sessionsdk.Client, session string) {
	_ = c.Evacuated(ctx, session)
	_ = c.Closed(ctx, session)
}

// TestService: commands reach the SDK, callbacks reach the Handler, and an
// instance touches only its own sessions.
func TestService(t *testing.T) {
	rec := newRecorder()
	svc, err := New(Options{Dir: shortDir(t) + "/s", Handler: rec.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	me := Owner{UID: os.Getuid(), GID: os.Getgid(), Member: func(pid int) bool { return pid == os.Getpid() }}
	sock1, err := svc.Serve("i1", me)
	if err != nil {
		t.Fatal(err)
	}
	sock2, err := svc.Serve("i2", me)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(sock1); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v %v, want mode 0600", sock1, st.Mode(), err)
	}
	if st, _ := os.Stat(svc.opts.Dir); st.Mode().Perm() != 0o711 {
		t.Fatalf("socket dir mode %v, want 0711", st.Mode())
	}

	// Queued before the instance connects.
	if err := svc.Start("i1", "s1", map[string]string{"user": "ada"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c1, err := sessionsdk.Connect(sessionsdk.Options{Socket: sock1, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	a := &app{started: make(chan sessionsdk.Session, 10)}
	runCtx, stopRun := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = c1.Run(runCtx, a)
	}()
	defer wg.Wait()
	defer stopRun()

	select {
	case s := <-a.started:
		if s.Name != "s1" || s.Data["user"] != "ada" {
			t.Fatalf("SessionStart: %+v", s)
		}
	case <-ctx.Done():
		t.Fatal("no SessionStart")
	}
	rec.wait(t, event{"i1", "s1", actor.ReadyCallback{}})
	rec.wait(t, event{"i1", "s1", actor.Heartbeat{}})
	if err := c1.ClientJoined(ctx, "s1", "c1"); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, event{"i1", "s1", actor.ClientJoin{Client: "c1"}})
	if err := c1.ClientLeft(ctx, "s1", "c1"); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, event{"i1", "s1", actor.ClientLeave{Client: "c1"}})

	// Not its own sessions: refused.
	if err := c1.Ready(ctx, "s2"); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Fatalf("Ready for a session never started on i1: %v, want PermissionDenied", err)
	}
	c2, err := sessionsdk.Connect(sessionsdk.Options{Socket: sock2})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.Closed(ctx, "s1"); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Fatalf("i2 closed i1's session: %v, want PermissionDenied", err)
	}

	if err := svc.CloseSession("i1", "s1"); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, event{"i1", "s1", actor.EvacuatedCallback{}})
	rec.wait(t, event{"i1", "s1", actor.ClosedCallback{}})
	svc.Forget("i1", "s1")
	if err := c1.Ready(ctx, "s1"); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Fatalf("Ready for a forgotten session: %v, want PermissionDenied", err)
	}
}

// TestServiceRefusesStrangers: a process that is not the instance's is
// let in neither by the socket's owner check nor by the member check.
func TestServiceRefusesStrangers(t *testing.T) {
	svc, err := New(Options{Dir: shortDir(t) + "/s", Handler: newRecorder().handle})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	sock, err := svc.Serve("i1", Owner{UID: os.Getuid(), GID: os.Getgid(), Member: func(int) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start("i1", "s1", nil); err != nil {
		t.Fatal(err)
	}
	c, err := sessionsdk.Connect(sessionsdk.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ready(ctx, "s1"); err == nil {
		t.Fatal("a process outside the instance called SessionReady")
	}
}

// TestForgetDropsUndeliveredCommands: an instance that never connects
// does not keep the commands of sessions already forgotten, so its queue
// does not fill up with them and refuse new sessions.
func TestForgetDropsUndeliveredCommands(t *testing.T) {
	svc, err := New(Options{Dir: shortDir(t) + "/s", Handler: newRecorder().handle})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	me := Owner{UID: os.Getuid(), GID: os.Getgid(), Member: func(pid int) bool { return pid == os.Getpid() }}
	if _, err := svc.Serve("i1", me); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < MaxQueued/2; n++ {
		s := fmt.Sprintf("s%d", n)
		if err := svc.Start("i1", s, nil); err != nil {
			t.Fatal(err)
		}
		if err := svc.CloseSession("i1", s); err != nil {
			t.Fatal(err)
		}
		svc.Forget("i1", s)
	}
	if err := svc.Start("i1", "fresh", nil); err != nil {
		t.Errorf("a new session after %d forgotten ones: %v", MaxQueued/2, err)
	}
	if got := svc.Sessions("i1"); len(got) != 1 || got[0] != "fresh" {
		t.Errorf("sessions = %v, want [fresh]", got)
	}
}
