// Package prepull runs a node job's image pre-pull flow (KubeEdge's
// ImagePrePullJob, seed 000): Check → Pull. Images are pulled with
// go-containerregistry into a local OCI image layout, so a machine without a
// container runtime can still be prepared; each image is retried with
// backoff and reported on its own.
//
// The flow runs on the agent's action-flow runner (internal/agent/runner),
// which persists each action's state in the agent DB before and after it
// runs: a finished action is never run again, only re-reported if its
// report was lost; an interrupted one runs again (both are safe to repeat:
// pulling an image already in the layout only re-reads its manifest).
//
// Credentials come from the spec (the job's Secret, per registry host) and
// are never logged or reported. Nothing here imports k8s.io.
package prepull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/drover-fleet/drover/internal/agent/checks"
	"github.com/drover-fleet/drover/internal/agent/registryauth"
	"github.com/drover-fleet/drover/internal/agent/runner"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// Reporter sends one action report to the hub (through the agent's durable
// outbox); it has the same shape as upgrade.Reporter, so one func serves
// both. phase is the work item's phase after the action.
type Reporter = func(ctx context.Context, phase string, r nodejobwire.Report) error

// Defaults.
const (
	// DefaultTimeout bounds the whole Pull when the job sets no timeout.
	DefaultTimeout = 30 * time.Minute
	// DefaultBackoff is the wait before an image's first retry; it doubles
	// up to MaxBackoff.
	DefaultBackoff = time.Second
	MaxBackoff     = 30 * time.Second
	// refAnnotation names an image in the layout's index.json (OCI spec).
	refAnnotation = "org.opencontainers.image.ref.name"
)

// Runner runs pre-pull work items. Fields are read-only once Run is called.
type Runner struct {
	// StoreDir is the OCI image layout the images go to. Required.
	StoreDir string
	// DB persists each action's state. Required.
	DB *store.Store
	// Transport reaches registries; default remote.DefaultTransport.
	Transport http.RoundTripper
	// Backoff is the wait before an image's first retry; default
	// DefaultBackoff.
	Backoff time.Duration
	// Check runs the pre-checks (disk is StoreDir's); default checks.Checker on Clock.
	Check func(ctx context.Context, c nodejobwire.Checks, dir string) error
	// Logger; default discard.
	Logger *slog.Logger
	// Clock stamps reports and times retries; default clock.Real().
	Clock clock.Clock
	// Lane, shared with the node's other node-job runners, runs one action
	// at a time across their flows. Nil: no sharing.
	Lane *runner.Lane
	// Import, when set, copies an image just pulled into StoreDir on into
	// the node's container runtime (drover-containerd import), so that
	// containerd tasks of it start without a pull. Its failure fails the
	// image's attempt (and is retried with it); ErrNoRuntime means the
	// node has no runtime to import into now: the image is pulled only.
	Import func(ctx context.Context, image string) error
}

// ErrNoRuntime is Import's error on a node without a container runtime.
var ErrNoRuntime = errors.New("no container runtime on this node")

func (r *Runner) setup() error {
	if r.StoreDir == "" || r.DB == nil {
		return errors.New("pre-pull runner: StoreDir and DB are required")
	}
	if r.Transport == nil {
		r.Transport = remote.DefaultTransport
	}
	if r.Backoff <= 0 {
		r.Backoff = DefaultBackoff
	}
	r.Clock = clock.Or(r.Clock)
	if r.Check == nil {
		r.Check = checks.Checker{Clock: r.Clock}.Check
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Run runs (or resumes) the flow of work item uid with spec (the JSON of a
// nodejobwire.PrePullSpec) and returns nodejobwire.PhaseSucceeded or
// nodejobwire.PhaseFailed with a reason. Called again for the same uid, it
// does not repeat a finished action.
func (r *Runner) Run(ctx context.Context, uid string, spec []byte, report Reporter) (phase, reason string) {
	if err := r.setup(); err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	fr, err := runner.New(runner.Options{Store: r.DB, Clock: r.Clock, Lane: r.Lane})
	if err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	s, specErr := nodejobwire.DecodePrePull(spec)
	if specErr != nil {
		specErr = fmt.Errorf("invalid spec: %w", specErr)
	}
	// Both actions are safe to repeat: no Resume, an interrupted one runs
	// again.
	actions := runner.Actions{
		nodejobwire.Check: runner.ActionFunc(func(ctx context.Context, _ *runner.Step) (runner.Outcome, error) {
			return r.check(ctx, s, specErr), nil
		}),
		nodejobwire.Pull: runner.ActionFunc(func(ctx context.Context, _ *runner.Step) (runner.Outcome, error) {
			if specErr != nil {
				return runner.Fail(specErr.Error(), nil), nil
			}
			return r.pull(ctx, s), nil
		}),
	}
	end, err := fr.Run(ctx, uid, nodejobwire.PrePullFlow(), actions, func(ctx context.Context, rep runner.Report) error {
		w := nodejobwire.Report{Action: rep.Action, Success: rep.Success, Running: rep.Waiting, Reason: rep.Reason, Time: rep.Time}
		if len(rep.Data) > 0 {
			_ = json.Unmarshal(rep.Data, &w.Images) // our own JSON
		}
		return report(ctx, rep.Phase(), w)
	})
	if err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	return end.Phase(), end.Reason
}

func (r *Runner) check(ctx context.Context, s nodejobwire.PrePullSpec, specErr error) runner.Outcome {
	if specErr != nil {
		return runner.Fail(specErr.Error(), nil)
	}
	if err := os.MkdirAll(r.StoreDir, 0o755); err != nil {
		return runner.Fail(fmt.Sprintf("create image store %s: %v", r.StoreDir, err), nil)
	}
	if err := r.Check(ctx, s.Checks, r.StoreDir); err != nil {
		return runner.Fail(err.Error(), nil)
	}
	return runner.OK("checks passed", nil)
}

// pull pulls every image of s, in order, each with its retries.
func (r *Runner) pull(ctx context.Context, s nodejobwire.PrePullSpec) runner.Outcome {
	timeout := DefaultTimeout
	if s.TimeoutSeconds > 0 {
		timeout = time.Duration(s.TimeoutSeconds) * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lp, err := openLayout(r.StoreDir)
	if err != nil {
		return runner.Fail(fmt.Sprintf("open image store %s: %v", r.StoreDir, err), nil)
	}
	results := make([]nodejobwire.ImageResult, 0, len(s.Images))
	var failed []string
	imported := 0
	for _, im := range s.Images {
		in, err := r.pullOne(pctx, lp, im, s)
		if in {
			imported++
		}
		res := nodejobwire.ImageResult{Image: im, Success: err == nil}
		if err != nil {
			if pctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("%w (pull timeout %s)", err, timeout)
			}
			res.Reason = err.Error()
			failed = append(failed, im+": "+err.Error())
			r.Logger.Warn("pre-pull: image failed", "image", im, "err", err)
		}
		results = append(results, res)
	}
	data, _ := json.Marshal(results) // plain structs: cannot fail
	if len(failed) > 0 {
		return runner.Fail(fmt.Sprintf("%d of %d images failed: %s", len(failed), len(s.Images), strings.Join(failed, "; ")), data)
	}
	msg := fmt.Sprintf("pulled %d images", len(s.Images))
	if imported > 0 {
		msg += fmt.Sprintf(" (and imported %d into containerd)", imported)
	}
	return runner.OK(msg, data)
}

// openLayout opens the OCI layout at dir, creating an empty one.
func openLayout(dir string) (layout.Path, error) {
	if lp, err := layout.FromPath(dir); err == nil {
		return lp, nil
	}
	return layout.Write(dir, empty.Index)
}

// pullOne pulls image into lp, retrying s.RetryTimes times with a doubling
// backoff. Errors a retry cannot fix (bad credentials, no such image) are
// not retried.
func (r *Runner) pullOne(ctx context.Context, lp layout.Path, image string, s nodejobwire.PrePullSpec) (imported bool, err error) {
	ref, err := name.ParseReference(image)
	if err != nil {
		return false, err
	}
	registry := ref.Context().RegistryStr()
	auth, user := registryauth.For(s.Auth, ref)
	wait := r.Backoff
	for attempt := 0; ; attempt++ {
		err = r.fetch(ctx, lp, ref, image, auth)
		imported = false
		if err == nil && r.Import != nil {
			switch ierr := r.Import(ctx, image); {
			case ierr == nil:
				imported = true
			case errors.Is(ierr, ErrNoRuntime):
			default:
				err = fmt.Errorf("pulled, but not imported into containerd: %w", ierr)
			}
		}
		if err == nil {
			return imported, nil
		}
		err = registryauth.Explain(err, registry, user)
		if registryauth.Permanent(err) || attempt >= s.RetryTimes || ctx.Err() != nil {
			if attempt > 0 {
				err = fmt.Errorf("%w (after %d attempts)", err, attempt+1)
			}
			return false, err
		}
		r.Logger.Info("pre-pull: retrying", "image", image, "attempt", attempt+1, "err", err)
		t := r.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("%w (interrupted before retry %d: %v)", err, attempt+1, ctx.Err())
		case <-t.Chan():
		}
		wait = min(2*wait, MaxBackoff)
	}
}

// fetch makes one attempt: resolve the image and write it (blobs the
// layout holds are not downloaded again) under its reference.
func (r *Runner) fetch(ctx context.Context, lp layout.Path, ref name.Reference, image string, auth authn.Authenticator) error {
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuth(auth), remote.WithTransport(r.Transport),
		// Retries are ours (RetryTimes, reported); none hidden below.
		remote.WithRetryPredicate(func(error) bool { return false }), remote.WithRetryStatusCodes())
	if err != nil {
		return err
	}
	ann := map[string]string{refAnnotation: image}
	return lp.ReplaceImage(img, match.Annotation(refAnnotation, image), layout.WithAnnotations(ann))
}
