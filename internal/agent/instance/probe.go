package instance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// Probe is a liveness or readiness probe: exactly one of Exec, TCP and
// HTTPPath is set.
type Probe struct {
	// Exec is an argv run in the instance's dir, as its user, in its
	// cgroup (never through a shell); exit 0 passes.
	Exec []string `json:"exec,omitempty"`
	// TCP: a connection to the instance's port passes.
	TCP bool `json:"tcp,omitempty"`
	// HTTPPath: GET http://127.0.0.1:<port><path> answering 2xx or 3xx passes.
	HTTPPath string `json:"httpPath,omitempty"`
	// Timeout of one try; 0 means DefaultProbeTimeout.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// DefaultProbeTimeout bounds one try of a probe.
const DefaultProbeTimeout = time.Second

// Validate says what is wrong with p.
func (p *Probe) Validate() error {
	n := 0
	if len(p.Exec) > 0 {
		n++
	}
	if p.TCP {
		n++
	}
	if p.HTTPPath != "" {
		n++
		if p.HTTPPath[0] != '/' {
			return fmt.Errorf("probe httpPath %q: want a path starting with /", p.HTTPPath)
		}
	}
	if n != 1 {
		return errors.New("a probe has exactly one of exec, tcp and httpPath")
	}
	return nil
}

// Probe tries p once against the instance; nil means it passed. A frozen
// instance is not probed (its probe would hang): its liveness is Alive.
func (i *Instance) Probe(ctx context.Context, p Probe) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if i.Frozen() {
		return errors.New("the instance is frozen: only Alive checks it")
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(i.port))
	switch {
	case p.TCP:
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("tcp probe: %w", err)
		}
		return c.Close()
	case p.HTTPPath != "":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+p.HTTPPath, nil)
		if err != nil {
			return fmt.Errorf("http probe: %w", err)
		}
		resp, err := i.rt.http.Do(req)
		if err != nil {
			return fmt.Errorf("http probe: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("http probe: GET %s answered %s", p.HTTPPath, resp.Status)
		}
		return nil
	default:
		return i.execProbe(ctx, p.Exec)
	}
}

// execProbe runs argv as the instance's user, in its dir and cgroup.
func (i *Instance) execProbe(ctx context.Context, argv []string) error {
	if i.cred == nil && os.Geteuid() == 0 {
		// The instance's user is unknown (its dir is root's, or could
		// not be read): an application's probe command must not run as
		// the agent, root.
		return errors.New("exec probe: refused: it would run as root (the instance's dir is not owned by its user)")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("exec probe: %w", err)
	}
	cmd := exec.CommandContext(ctx, path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Dir = i.dir
	cmd.Env = append([]string{"PATH=" + defaultPath, "HOME=" + i.dir}, i.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if i.cred != nil {
		cmd.SysProcAttr.Credential = i.cred
	}
	// The probe kills its own group on timeout: a hung probe leaves nothing.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	if i.group != nil {
		done, err := i.group.Prepare(cmd)
		if err != nil {
			return fmt.Errorf("exec probe: %w", err)
		}
		defer done()
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		if len(out) > 512 {
			out = out[len(out)-512:]
		}
		return fmt.Errorf("exec probe %q: %w: %s", argv[0], err, out)
	}
	return nil
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
