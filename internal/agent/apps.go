package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/drover-fleet/drover/internal/agent/apps"
	"github.com/drover-fleet/drover/internal/agent/instance"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/store"
)

// AppOptions enable serverless instances and sessions (issue 16) on the
// agent: work items of types appwire.TypeInstance and TypeSession, run by
// the node actor (internal/agent/apps).
type AppOptions struct {
	// SocketDir holds the instances' session sockets. Every dir above it
	// must let the instances' users through (o+x), and its paths must stay
	// short (a unix socket path has at most 107 bytes). Default:
	// StateDir + "-sessions".
	SocketDir string
	// PortMin and PortMax bound the host ports instances get (each its
	// own); 0 and 0: ports the kernel chooses.
	PortMin, PortMax int
}

// instanceAction is the work_actions row of an instance: its process's
// Info while it may run (Running), so that a restart finds and stops it.
const instanceAction = "Instance"

// appSet is the node actor, as the runner of both work types.
type appSet struct {
	node    *apps.Node
	runners map[string]Runner
}

// appRunners are the runners of serverless instances and sessions, on the
// task driver d (instances are its attempts, named by their work uids).
func (a *Agent) appRunners(ctx context.Context, db *store.Store, d *taskexec.Driver) (*appSet, error) {
	o := a.opts.Apps
	log := a.log.With("runner", "apps")
	ports, err := instance.NewPorts(o.PortMin, o.PortMax)
	if err != nil {
		return nil, fmt.Errorf("instance ports: %w", err)
	}
	rt, err := instance.New(instance.Options{Driver: d, Ports: ports, Clock: a.opts.Clock, Logger: log})
	if err != nil {
		return nil, err
	}
	dir := o.SocketDir
	if dir == "" {
		dir = a.opts.StateDir + "-sessions"
	}
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		// The socket is the instance's user's: the task user unless its
		// spec names one (the driver's rule).
		u := a.opts.TaskUser
		if u == nil {
			lu, err := taskexec.LookupUser(taskexec.DefaultTaskUser)
			if err != nil {
				return nil, fmt.Errorf("apps: %w", err)
			}
			u = &lu
		}
		uid, gid = int(u.UID), int(u.GID)
	}
	st := appStore{db: db}
	prt := apps.ProcessRuntime(rt, d, log)
	if err := st.prune(ctx, prt, log); err != nil {
		return nil, err
	}
	n, err := apps.New(apps.Options{Runtime: prt, SocketDir: dir, Store: st,
		Cancelled:  func(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrCancelled) },
		DefaultUID: uid, DefaultGID: gid, Clock: a.opts.Clock, Logger: log})
	if err != nil {
		return nil, err
	}
	r := appRunner{n: n}
	return &appSet{node: n, runners: map[string]Runner{appwire.TypeInstance: r, appwire.TypeSession: r}}, nil
}

// appRunner runs instances and sessions, many at once.
type appRunner struct{ n *apps.Node }

var _ ConcurrentRunner = appRunner{}

func (appRunner) RunsConcurrently() {}

func (appRunner) Run(context.Context, store.Work) (string, string) {
	return PhaseFailed, "an instance or a session runs only with progress reports"
}

func (r appRunner) RunReporting(ctx context.Context, w store.Work, env Env) (string, string, string) {
	return r.n.Run(ctx, w.UID, w.Type, w.Spec, env.Report)
}

func (r appRunner) Resume(ctx context.Context, w store.Work, env Env) (string, string, string) {
	return r.n.Resume(ctx, w.UID, w.Type, w.Spec, env.Report)
}

// appStore keeps the node actor's records in the agent's DB.
type appStore struct{ db *store.Store }

func (s appStore) SetRecord(ctx context.Context, uid string, running bool, data []byte) error {
	state := store.ActionSucceeded
	if running {
		state = store.ActionRunning
	}
	return s.db.SetAction(ctx, store.Action{UID: uid, Action: instanceAction, State: state, Data: data})
}

func (s appStore) Record(ctx context.Context, uid string) ([]byte, bool, error) {
	acts, err := s.db.Actions(ctx, uid)
	if err != nil {
		return nil, false, err
	}
	for _, a := range acts {
		if a.Action == instanceAction {
			return a.Data, true, nil
		}
	}
	return nil, false, nil
}

func (s appStore) WorkPhase(ctx context.Context, uid string) (string, bool, error) {
	w, ok, err := s.db.Work(ctx, uid)
	return w.Phase, ok, err
}

// prune forgets the records of instances whose work the DB no longer holds
// (the hub dropped it while the agent was down); one whose process may
// still run is stopped first: nobody would ever report it.
func (s appStore) prune(ctx context.Context, rt apps.Runtime, log *slog.Logger) error {
	for _, state := range []string{store.ActionSucceeded, store.ActionRunning} {
		acts, err := s.db.ActionsInState(ctx, state)
		if err != nil {
			return err
		}
		for _, act := range acts {
			if act.Action != instanceAction {
				continue
			}
			if _, ok, err := s.db.Work(ctx, act.UID); err != nil || ok {
				if err != nil {
					return err
				}
				continue
			}
			var rec struct {
				Info taskexec.Info `json:"info"`
			}
			if state == store.ActionRunning && json.Unmarshal(act.Data, &rec) == nil && rec.Info.PID > 0 {
				log.Info("stopping an instance the hub dropped while the agent was down", "instance", act.UID, "pid", rec.Info.PID)
				sctx, cancel := context.WithTimeout(ctx, 40*time.Second)
				if err := rt.StopLeftover(sctx, act.UID, rec.Info, 5*time.Second); err != nil {
					log.Warn("cannot stop a dropped instance", "instance", act.UID, "err", err)
				}
				cancel()
			}
			if err := s.db.DeleteActions(ctx, act.UID); err != nil {
				return err
			}
		}
	}
	return nil
}
