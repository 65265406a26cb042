package ctrd

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/drover-fleet/drover/internal/ctrd/ctrdwire"
)

// Aliases of ctrdwire's names, for the companion's code.
const (
	DefaultAddress      = ctrdwire.DefaultAddress
	DefaultNamespace    = ctrdwire.DefaultNamespace
	DefaultSnapshotter  = ctrdwire.DefaultSnapshotter
	ReasonImageNotFound = ctrdwire.ReasonImageNotFound
	ReasonUnavailable   = ctrdwire.ReasonUnavailable
	ReasonStartError    = ctrdwire.ReasonStartError
	ReasonGone          = ctrdwire.ReasonGone
	ExitNotRun          = ctrdwire.ExitNotRun
)

// Result is ctrdwire.Result.
type Result = ctrdwire.Result

// ReadResult is ctrdwire.ReadResult.
func ReadResult(path string) (Result, bool, error) { return ctrdwire.ReadResult(path) }

// Commands are the companion's first arguments.
var Commands = []string{"run", "wait", "kill", "rm", "import"}

// IsCommand reports whether arg is one of Commands.
func IsCommand(arg string) bool {
	for _, c := range Commands {
		if arg == c {
			return true
		}
	}
	return false
}

type options struct {
	address, namespace, snapshotter string
	id, image, result, cwd, user    string
	layout                          string
	signal                          string
	memory, cpuMillis               int64
	env                             []string
	args                            []string
}

// Main runs the companion with args (without the program name) and returns
// its exit code.
func Main(args []string) int {
	if len(args) == 0 || !IsCommand(args[0]) {
		fmt.Fprintf(os.Stderr, "usage: drover-containerd %s [flags] [-- args]\n", strings.Join(Commands, "|"))
		return 2
	}
	cmd := args[0]
	var o options
	fs := flag.NewFlagSet("drover-containerd "+cmd, flag.ContinueOnError)
	fs.StringVar(&o.address, "address", DefaultAddress, "containerd's socket")
	fs.StringVar(&o.namespace, "namespace", DefaultNamespace, "containerd namespace of the containers and images")
	fs.StringVar(&o.snapshotter, "snapshotter", DefaultSnapshotter, "snapshotter of the containers' root filesystems")
	fs.StringVar(&o.id, "id", "", "container id")
	fs.StringVar(&o.image, "image", "", "image reference (run, import)")
	fs.StringVar(&o.layout, "layout", "", "OCI image layout to import the image from (import)")
	fs.StringVar(&o.result, "result", "", "result file to write (run, wait)")
	fs.StringVar(&o.cwd, "cwd", "", "working dir inside the container (run; default the image's)")
	fs.StringVar(&o.user, "user", "", "uid:gid the container runs as (run; required)")
	fs.StringVar(&o.signal, "signal", "TERM", "TERM or KILL (kill)")
	fs.Int64Var(&o.memory, "memory", 0, "memory limit in bytes (run; 0: none)")
	fs.Int64Var(&o.cpuMillis, "cpu-millis", 0, "CPU quota in thousandths of a CPU (run; 0: none)")
	fs.Func("env", "NAME=value added to the image's environment (run; repeatable)", func(s string) error {
		if name, _, ok := strings.Cut(s, "="); !ok || name == "" {
			return fmt.Errorf("%q is not NAME=value", s)
		}
		o.env = append(o.env, s)
		return nil
	})
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	o.args = fs.Args()
	if cmd == "import" {
		return o.importImage(context.Background())
	}
	if o.id == "" {
		fmt.Fprintln(os.Stderr, "drover-containerd: --id is required")
		return 2
	}
	// Its stdout is the attempt's log pipe; a closed reader must not kill
	// it before it wrote the result.
	signalIgnore()
	ctx := context.Background()
	switch cmd {
	case "run":
		return o.run(ctx)
	case "wait":
		return o.wait(ctx)
	case "kill":
		return o.kill(ctx)
	default:
		return o.rm(ctx)
	}
}

func (o *options) connect() (*containerd.Client, error) {
	c, err := containerd.New(o.address, containerd.WithDefaultNamespace(o.namespace), containerd.WithTimeout(30*time.Second))
	if err != nil {
		return nil, fmt.Errorf("cannot reach containerd at %s (is it running? drover-agent --containerd-address): %w", o.address, err)
	}
	return c, nil
}

// notRun writes a result saying why the container did not run.
func (o *options) notRun(reason string, err error) int {
	fmt.Fprintf(os.Stderr, "drover-containerd: %v\n", err)
	o.write(Result{Reason: reason, Message: err.Error()})
	return ExitNotRun
}

func (o *options) write(r Result) {
	if o.result == "" {
		return
	}
	b, _ := json.Marshal(r)
	tmp := o.result + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
		err = os.Rename(tmp, o.result)
		if err == nil {
			return
		}
	}
	fmt.Fprintf(os.Stderr, "drover-containerd: cannot write the result file %s\n", o.result)
}

func (o *options) run(ctx context.Context) int {
	if o.image == "" {
		return o.notRun(ReasonStartError, errors.New("--image is required"))
	}
	uid, gid, err := parseUser(o.user)
	if err != nil {
		return o.notRun(ReasonStartError, err)
	}
	if o.cwd != "" && !filepath.IsAbs(o.cwd) {
		return o.notRun(ReasonStartError, fmt.Errorf("--cwd %q must be absolute", o.cwd))
	}
	c, err := o.connect()
	if err != nil {
		return o.notRun(ReasonUnavailable, err)
	}
	defer c.Close()
	img, err := c.GetImage(ctx, o.image)
	if errdefs.IsNotFound(err) {
		return o.notRun(ReasonImageNotFound, fmt.Errorf("image %s is not in containerd's namespace %q on this node: "+
			"pre-pull it with an ImagePrePullJob or import it (ctr -n %s images import)", o.image, o.namespace, o.namespace))
	}
	if err != nil {
		return o.notRun(ReasonUnavailable, fmt.Errorf("look up image %s: %w", o.image, err))
	}
	if ok, err := img.IsUnpacked(ctx, o.snapshotter); err != nil || !ok {
		if err := img.Unpack(ctx, o.snapshotter); err != nil {
			return o.notRun(ReasonStartError, fmt.Errorf("unpack image %s into snapshotter %s: %w", o.image, o.snapshotter, err))
		}
	}
	specOpts := []oci.SpecOpts{oci.WithImageConfig(img)}
	if len(o.args) > 0 {
		specOpts = append(specOpts, oci.WithProcessArgs(o.args...))
	}
	specOpts = append(specOpts, oci.WithEnv(o.env), oci.WithUIDGID(uid, gid),
		oci.WithCapabilities([]string{}), oci.WithNoNewPrivileges, noAdditionalGIDs)
	if o.cwd != "" {
		specOpts = append(specOpts, oci.WithProcessCwd(o.cwd))
	}
	if o.memory > 0 {
		specOpts = append(specOpts, oci.WithMemoryLimit(uint64(o.memory)))
	}
	if o.cpuMillis > 0 {
		const period = 100_000 // µs
		specOpts = append(specOpts, oci.WithCPUCFS(o.cpuMillis*period/1000, period))
	}
	oom, stopEvents := o.watchOOM(ctx, c)
	defer stopEvents()
	ctr, err := c.NewContainer(ctx, o.id, containerd.WithImage(img), containerd.WithSnapshotter(o.snapshotter),
		containerd.WithNewSnapshot(o.id, img), containerd.WithNewSpec(specOpts...))
	if err != nil {
		return o.notRun(ReasonStartError, fmt.Errorf("create container %s: %w", o.id, err))
	}
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, os.Stdout, os.Stderr)))
	if err != nil {
		o.remove(ctr)
		return o.notRun(ReasonStartError, fmt.Errorf("create the task of container %s: %w", o.id, err))
	}
	exitC, err := task.Wait(ctx)
	if err == nil {
		err = task.Start(ctx)
	}
	if err != nil {
		o.remove(ctr)
		return o.notRun(ReasonStartError, fmt.Errorf("start container %s: %w", o.id, err))
	}
	return o.finish(ctr, task, exitC, oom)
}

// noAdditionalGIDs leaves the process its gid only, as the exec driver's
// processes (the image's /etc/group must not add groups).
func noAdditionalGIDs(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process != nil {
		s.Process.User.AdditionalGids = []uint32{s.Process.User.GID}
	}
	return nil
}

func (o *options) wait(ctx context.Context) int {
	c, err := o.connect()
	if err != nil {
		return o.notRun(ReasonUnavailable, err)
	}
	defer c.Close()
	ctr, err := c.LoadContainer(ctx, o.id)
	if errdefs.IsNotFound(err) {
		return o.notRun(ReasonGone, fmt.Errorf("container %s is not in containerd's namespace %q", o.id, o.namespace))
	}
	if err != nil {
		return o.notRun(ReasonUnavailable, fmt.Errorf("load container %s: %w", o.id, err))
	}
	oom, stopEvents := o.watchOOM(ctx, c)
	defer stopEvents()
	task, err := ctr.Task(ctx, cio.NewAttach(cio.WithStreams(nil, os.Stdout, os.Stderr)))
	if err != nil {
		o.remove(ctr)
		return o.notRun(ReasonGone, fmt.Errorf("container %s has no task to wait for: %w", o.id, err))
	}
	exitC, err := task.Wait(ctx)
	if err != nil {
		return o.notRun(ReasonUnavailable, fmt.Errorf("wait for container %s: %w", o.id, err))
	}
	return o.finish(ctr, task, exitC, oom)
}

// finish waits for the task's exit, writes the result and deletes the
// task and the container.
func (o *options) finish(ctr containerd.Container, task containerd.Task, exitC <-chan containerd.ExitStatus, oom *oomWatch) int {
	st := <-exitC
	code, _, err := st.Result()
	if err != nil {
		fmt.Fprintf(os.Stderr, "drover-containerd: container %s: %v\n", o.id, err)
	}
	// The OOM event may come just after the exit.
	killed := oom.seen(code == 137)
	o.write(Result{Ran: true, ExitCode: int32(code), OOMKilled: killed})
	// Delete waits for the output to be copied.
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := task.Delete(dctx); err != nil && !errdefs.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "drover-containerd: delete the task of %s: %v\n", o.id, err)
	}
	if err := ctr.Delete(dctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "drover-containerd: delete container %s: %v\n", o.id, err)
	}
	if code > 255 {
		return 255
	}
	return int(code)
}

// remove deletes a container whose task did not start.
func (o *options) remove(ctr containerd.Container) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if t, err := ctr.Task(ctx, nil); err == nil {
		_, _ = t.Delete(ctx, containerd.WithProcessKill)
	}
	if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "drover-containerd: delete container %s: %v\n", o.id, err)
	}
}

func (o *options) kill(ctx context.Context) int {
	sig := syscall.SIGTERM
	switch o.signal {
	case "TERM", "SIGTERM":
	case "KILL", "SIGKILL":
		sig = syscall.SIGKILL
	default:
		fmt.Fprintf(os.Stderr, "drover-containerd: --signal %q: want TERM or KILL\n", o.signal)
		return 2
	}
	c, err := o.connect()
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-containerd:", err)
		return 1
	}
	defer c.Close()
	ctr, err := c.LoadContainer(ctx, o.id)
	if err == nil {
		var task containerd.Task
		if task, err = ctr.Task(ctx, nil); err == nil {
			err = task.Kill(ctx, sig)
		}
	}
	if err != nil && !errdefs.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "drover-containerd: kill container %s: %v\n", o.id, err)
		return 1
	}
	return 0
}

func (o *options) rm(ctx context.Context) int {
	c, err := o.connect()
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-containerd:", err)
		return 1
	}
	defer c.Close()
	ctr, err := c.LoadContainer(ctx, o.id)
	if errdefs.IsNotFound(err) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "drover-containerd: load container %s: %v\n", o.id, err)
		return 1
	}
	o.remove(ctr)
	return 0
}

// oomWatch learns from containerd's events whether the kernel OOM-killed
// in the container.
type oomWatch struct {
	hit   atomic.Bool
	seenC chan struct{}
}

func (o *options) watchOOM(ctx context.Context, c *containerd.Client) (*oomWatch, func()) {
	w := &oomWatch{seenC: make(chan struct{})}
	ctx, cancel := context.WithCancel(ctx)
	ch, errs := c.Subscribe(ctx, `topic=="/tasks/oom"`)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case env := <-ch:
				if env == nil || env.Event == nil {
					continue
				}
				v, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				if e, ok := v.(*apievents.TaskOOM); ok && e.ContainerID == o.id && !w.hit.Swap(true) {
					close(w.seenC)
				}
			case <-errs:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return w, func() { cancel(); <-done }
}

// seen reports whether an OOM kill was seen; likely (a SIGKILL exit) waits a
// little for an event that may follow the exit.
func (w *oomWatch) seen(likely bool) bool {
	if likely && !w.hit.Load() {
		select {
		case <-w.seenC:
		case <-time.After(2 * time.Second):
		}
	}
	return w.hit.Load()
}

func parseUser(s string) (uint32, uint32, error) {
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("--user %q: want uid:gid", s)
	}
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("--user %q: want numeric uid:gid", s)
	}
	return uint32(uid), uint32(gid), nil
}

// signalIgnore: a write to a log pipe whose reader is gone, or a hang-up,
// must not kill the companion before it wrote the result.
func signalIgnore() { signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP) }
