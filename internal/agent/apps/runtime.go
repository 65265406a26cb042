package apps

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/instance"
	"github.com/drover-fleet/drover/internal/agent/sessionsvc"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// Runtime starts instances. ProcessRuntime is the real one; tests of the
// routing use a fake.
type Runtime interface {
	Start(ctx context.Context, spec instance.Spec) (Instance, error)
	// StopLeftover stops what is left of an instance a former agent
	// process started (info was recorded when it started): its process
	// and its cgroup, frozen or not.
	StopLeftover(ctx context.Context, name string, info taskexec.Info, grace time.Duration) error
}

// Instance is one running instance (*instance.Instance).
type Instance interface {
	Port() int
	Info() taskexec.Info
	Done() <-chan struct{}
	Result() taskexec.Result
	WaitLive(ctx context.Context, liveness, readiness *instance.Probe, period time.Duration) error
	Freeze(ctx context.Context) (time.Duration, error)
	Thaw(ctx context.Context) (time.Duration, error)
	Stop(ctx context.Context, grace time.Duration) error
	Status() instance.Status
	WriteSessionFile(m instance.SessionMetadata) error
	Member(pid int) bool
}

// Sessions is the node's session service (*sessionsvc.Service).
type Sessions interface {
	Serve(instance string, owner sessionsvc.Owner) (string, error)
	Remove(instance string)
	Start(instance, session string, data map[string]string) error
	CloseSession(instance, session string) error
	Forget(instance, session string)
	Close()
}

// ProcessRuntime is the process runtime (internal/agent/instance) on the
// task driver d, which also finds leftovers after a restart.
func ProcessRuntime(rt *instance.Runtime, d *taskexec.Driver, log *slog.Logger) Runtime {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return processRuntime{rt: rt, d: d, log: log}
}

type processRuntime struct {
	rt  *instance.Runtime
	d   *taskexec.Driver
	log *slog.Logger
}

func (p processRuntime) Start(ctx context.Context, spec instance.Spec) (Instance, error) {
	i, err := p.rt.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return i, nil
}

func (p processRuntime) StopLeftover(ctx context.Context, name string, info taskexec.Info, grace time.Duration) error {
	if len(info.Cgroup) > 0 {
		// A frozen process takes no SIGTERM (nor, on cgroup v1, SIGKILL):
		// thaw first. A cgroup already gone is fine.
		if g, err := cgroup.Open(info.Cgroup, p.log); err == nil && g.Exists() {
			if err := g.Thaw(ctx); err != nil {
				p.log.Warn("cannot thaw a leftover instance; killing its cgroup", "instance", name, "err", err)
				_ = g.Kill()
			}
		}
	}
	// Adopt checks the pid's start time: a pid reused since is left alone.
	proc := p.d.Adopt(name, &taskwire.Spec{}, info)
	proc.Stop(grace)
	select {
	case <-proc.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leftover instance %s (pid %d) not stopped: %w", name, info.PID, ctx.Err())
	}
}
