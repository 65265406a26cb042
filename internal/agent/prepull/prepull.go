// Package prepull runs a node job's image pre-pull flow (KubeEdge's
// ImagePrePullJob, seed 000): Check → Pull. Images are pulled with
// go-containerregistry into a local OCI image layout, so a machine without a
// container runtime can still be prepared; each image is retried with
// backoff and reported on its own.
//
// Each action's state is persisted in the agent DB before and after it runs
// (store.Action rows), as in package upgrade: a finished action is never run
// again, only re-reported if its report was lost; an interrupted one runs
// again (both are safe to repeat: pulling an image already in the layout
// only re-reads its manifest).
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
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// Reporter sends one action report to the hub (through the agent's durable
// outbox); it has the same shape as upgrade.Reporter, so one func serves
// both. phase is the work item's phase after the action.
type Reporter func(ctx context.Context, phase string, r nodejobwire.Report) error

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
	// Check runs the pre-checks (disk is StoreDir's); default checks.Check.
	Check func(ctx context.Context, c nodejobwire.Checks, dir string) error
	// Logger; default discard.
	Logger *slog.Logger
	// Now stamps reports; default time.Now.
	Now func() time.Time
}

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
	if r.Check == nil {
		r.Check = checks.Check
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	return nil
}

// Run runs (or resumes) the flow of work item uid with spec (the JSON of a
// nodejobwire.PrePullSpec) and returns nodejobwire.PhaseSucceeded or nodejobwire.PhaseFailed with
// a reason. Called again for the same uid, it does not repeat a finished
// action.
func (r *Runner) Run(ctx context.Context, uid string, spec []byte, report Reporter) (phase, reason string) {
	if err := r.setup(); err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	s, specErr := nodejobwire.DecodePrePull(spec)
	if specErr != nil {
		specErr = fmt.Errorf("invalid spec: %w", specErr)
	}
	rows, err := r.DB.Actions(ctx, uid)
	if err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	done := map[string]store.Action{}
	for _, a := range rows {
		done[a.Action] = a
	}
	for a := nodejobwire.PrePullFlow().First; a != nil; {
		row, seen := done[a.Name]
		if !seen || row.State == store.ActionRunning {
			// Before the action: a crash from here on finds it Running and
			// runs it again.
			if err := r.DB.SetAction(ctx, store.Action{UID: uid, Action: a.Name, State: store.ActionRunning}); err != nil {
				return nodejobwire.PhaseFailed, err.Error()
			}
			success, reason, images := r.do(ctx, a.Name, s, specErr)
			if ctx.Err() != nil {
				// Interrupted (the agent stops, or the item was cancelled):
				// record no end, so that a later run does it again.
				return nodejobwire.PhaseFailed, fmt.Sprintf("%s interrupted: %v", a.Name, context.Cause(ctx))
			}
			row = store.Action{UID: uid, Action: a.Name, State: store.ActionFailed, Reason: reason}
			if success {
				row.State = store.ActionSucceeded
			}
			if images != nil {
				row.Data, _ = json.Marshal(images) // plain structs: cannot fail
			}
			if err := r.DB.SetAction(ctx, row); err != nil {
				return nodejobwire.PhaseFailed, err.Error()
			}
		}
		success := row.State == store.ActionSucceeded
		res := nodejobwire.After(a, success)
		phase := map[nodejobwire.Result]string{nodejobwire.Running: nodejobwire.PhaseRunning, nodejobwire.Succeeded: nodejobwire.PhaseSucceeded, nodejobwire.Failed: nodejobwire.PhaseFailed}[res]
		if !row.Reported {
			rep := nodejobwire.Report{Action: a.Name, Success: success, Reason: row.Reason, Time: r.Now()}
			if len(row.Data) > 0 {
				_ = json.Unmarshal(row.Data, &rep.Images) // our own JSON
			}
			if err := report(ctx, phase, rep); err != nil {
				return nodejobwire.PhaseFailed, fmt.Sprintf("report %s: %v", a.Name, err)
			}
			if err := r.DB.MarkActionReported(ctx, uid, a.Name); err != nil {
				return nodejobwire.PhaseFailed, err.Error()
			}
		}
		if res != nodejobwire.Running {
			return phase, row.Reason
		}
		a = a.Next(success)
	}
	return nodejobwire.PhaseFailed, "empty flow" // cannot happen: flows have a first action
}

func (r *Runner) do(ctx context.Context, action string, s nodejobwire.PrePullSpec, specErr error) (bool, string, []nodejobwire.ImageResult) {
	if specErr != nil {
		return false, specErr.Error(), nil
	}
	switch action {
	case nodejobwire.Check:
		if err := os.MkdirAll(r.StoreDir, 0o755); err != nil {
			return false, fmt.Sprintf("create image store %s: %v", r.StoreDir, err), nil
		}
		if err := r.Check(ctx, s.Checks, r.StoreDir); err != nil {
			return false, err.Error(), nil
		}
		return true, "checks passed", nil
	case nodejobwire.Pull:
		return r.pull(ctx, s)
	}
	return false, fmt.Sprintf("unknown action %q", action), nil
}

// pull pulls every image of s, in order, each with its retries.
func (r *Runner) pull(ctx context.Context, s nodejobwire.PrePullSpec) (bool, string, []nodejobwire.ImageResult) {
	timeout := DefaultTimeout
	if s.TimeoutSeconds > 0 {
		timeout = time.Duration(s.TimeoutSeconds) * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lp, err := openLayout(r.StoreDir)
	if err != nil {
		return false, fmt.Sprintf("open image store %s: %v", r.StoreDir, err), nil
	}
	results := make([]nodejobwire.ImageResult, 0, len(s.Images))
	var failed []string
	for _, im := range s.Images {
		err := r.pullOne(pctx, lp, im, s)
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
	if len(failed) > 0 {
		return false, fmt.Sprintf("%d of %d images failed: %s", len(failed), len(s.Images), strings.Join(failed, "; ")), results
	}
	return true, fmt.Sprintf("pulled %d images", len(s.Images)), results
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
func (r *Runner) pullOne(ctx context.Context, lp layout.Path, image string, s nodejobwire.PrePullSpec) error {
	ref, err := name.ParseReference(image)
	if err != nil {
		return err
	}
	registry := ref.Context().RegistryStr()
	auth, user := registryauth.For(s.Auth, ref)
	wait := r.Backoff
	for attempt := 0; ; attempt++ {
		err = r.fetch(ctx, lp, ref, image, auth)
		if err == nil {
			return nil
		}
		err = registryauth.Explain(err, registry, user)
		if registryauth.Permanent(err) || attempt >= s.RetryTimes || ctx.Err() != nil {
			if attempt > 0 {
				err = fmt.Errorf("%w (after %d attempts)", err, attempt+1)
			}
			return err
		}
		r.Logger.Info("pre-pull: retrying", "image", image, "attempt", attempt+1, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (interrupted before retry %d: %v)", err, attempt+1, ctx.Err())
		case <-t.C:
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
