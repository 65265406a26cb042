// Package ctrdtest starts a real containerd for tests, with its own
// config, root, state and sockets under a temp dir, and imports into it a
// test image built here: testprog (a static Go program, see its doc) on an
// empty image, made with go-containerregistry (no registry is needed).
//
// containerd and runc come from the machine (scripts/test installs them);
// containerd needs root. A test that cannot have them fails, saying to run
// `bash scripts/test` as root: container tests never skip silently.
//
// containerd 1.6 still writes a few things under /run/containerd whatever
// its config says (the shims' sockets under /run/containerd/s, named by a
// hash of the daemon's address and the container, and the clients' FIFOs
// under /run/containerd/fifo): Start creates that dir, and daemons of
// different tests do not collide there.
package ctrdtest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Namespace is the containerd namespace tests use (the agent's default).
const Namespace = "drover"

// ImageRef is the test image's reference once imported.
const ImageRef = "drover.test/testprog:1"

// StartTimeout bounds the wait for the daemon's socket (generous: a loaded
// 2-core machine).
const StartTimeout = 60 * time.Second

// NeedRoot is the message of a test that cannot run containerd.
const NeedRoot = "the containerd tests need root, containerd and runc: run `bash scripts/test` as root (it installs containerd and runc when missing)"

// Daemon is a running containerd.
type Daemon struct {
	// Address is its socket.
	Address string
	// Dir holds its config, root, state, sockets and log.
	Dir    string
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{} // closed once cmd was reaped
}

// Start starts containerd under a new temp dir (short: a socket path is at
// most 107 bytes) and waits for its API. Its error says what to do.
func Start(ctx context.Context) (*Daemon, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New(NeedRoot)
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return nil, fmt.Errorf("%s (%w)", NeedRoot, err)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, fmt.Errorf("%s (%w)", NeedRoot, err)
	}
	if err := os.MkdirAll("/run/containerd", 0o711); err != nil {
		return nil, fmt.Errorf("containerd writes under /run/containerd: %w", err)
	}
	dir, err := os.MkdirTemp("", "ctrd")
	if err != nil {
		return nil, err
	}
	d := &Daemon{Address: filepath.Join(dir, "c.sock"), Dir: dir}
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = %[5]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[6]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), d.Address, d.Address+".ttrpc",
		filepath.Join(dir, "debug.sock"), filepath.Join(dir, "opt"))
	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	if d.log, err = os.Create(filepath.Join(dir, "containerd.log")); err != nil {
		return nil, err
	}
	d.cmd = exec.Command(bin, "--config", conf)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	// Its own group: a test's ^C does not reach it before Stop.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		d.log.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	d.exited = make(chan struct{})
	var werr error
	go func() { werr = d.cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(StartTimeout)
	for {
		c, err := containerd.New(d.Address, containerd.WithTimeout(2*time.Second))
		if err == nil {
			_, err = c.Version(ctx)
			c.Close()
			if err == nil {
				return d, nil
			}
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("containerd exited (%v): %s", werr, d.tail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Stop()
			return nil, fmt.Errorf("containerd's socket %s did not answer within %s: %s", d.Address, StartTimeout, d.tail())
		}
	}
}

// tail is the end of the daemon's log.
func (d *Daemon) tail() string {
	b, _ := os.ReadFile(d.log.Name())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Log is the daemon's log, for a failing test to show.
func (d *Daemon) Log() string { return d.tail() }

// Stop stops the daemon (SIGTERM, then SIGKILL after 10s) and removes its
// dir.
func (d *Daemon) Stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	d.log.Close()
	// Leftover mounts (a test that failed half way) would make RemoveAll
	// fail; unmount what is under the dir first.
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], d.Dir+"/") {
				_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
			}
		}
	}
	os.RemoveAll(d.Dir)
}

// Client connects to the daemon in Namespace.
func (d *Daemon) Client() (*containerd.Client, error) {
	return containerd.New(d.Address, containerd.WithDefaultNamespace(Namespace), containerd.WithTimeout(30*time.Second))
}

// ImportTestImage builds testprog (go build, static) and imports it as
// ImageRef.
func (d *Daemon) ImportTestImage(ctx context.Context) error {
	tmp, err := os.MkdirTemp("", "testprog")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "testprog")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/drover-fleet/drover/internal/ctrdtest/testprog")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build testprog: %w: %s", err, out)
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var archive bytes.Buffer
	if err := WriteImage(&archive, ImageRef, prog); err != nil {
		return err
	}
	c, err := d.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Import(ctx, &archive); err != nil {
		return fmt.Errorf("import the test image: %w", err)
	}
	return nil
}

// WriteImage writes a docker-archive tarball of an image named ref that
// holds prog as /testprog, its entrypoint.
func WriteImage(w io.Writer, ref string, prog []byte) error {
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := tw.WriteHeader(&tar.Header{Name: "testprog", Mode: 0o755, Size: int64(len(prog)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(prog); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Entrypoint: []string{"/testprog"}, Env: []string{"PATH=/"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.Write(tag, img, w)
}

// RunTests is the body of a container test package's TestMain: it starts
// a containerd with the test image imported, sets *daemon to it, runs
// the tests and stops it. A containerd that cannot start fails the run,
// saying why.
func RunTests(m *testing.M, daemon **Daemon) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := Start(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer d.Stop()
	if err := d.ImportTestImage(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err, d.Log())
		return 1
	}
	*daemon = d
	return m.Run()
}
