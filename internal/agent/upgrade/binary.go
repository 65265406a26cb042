package upgrade

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/drover-fleet/drover/internal/agent/registryauth"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// fetch downloads the job's binary to path (created 0755) and checks its
// sha256: an HTTP(S) URL's body, or an OCI artifact's first layer, which
// holds the binary either raw or as a tar of one file.
func (r *Runner) fetch(ctx context.Context, s nodejobwire.UpgradeSpec, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("download %s: %w", s.Version, err)
	}
	var (
		body io.ReadCloser
		src  string
		err  error
	)
	if s.URL != "" {
		src = s.URL
		body, err = r.httpGet(ctx, s.URL)
	} else {
		src = s.Image
		body, err = r.ociLayer(ctx, s.Image, s.Auth)
	}
	if err != nil {
		return fmt.Errorf("download %s from %s: %w", s.Version, src, err)
	}
	defer body.Close()
	got, err := writeFile(path, body, 0o755)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timeout %s)", err, timeout)
		}
		return fmt.Errorf("download %s from %s: %w", s.Version, src, err)
	}
	if got != s.SHA256 {
		_ = os.Remove(path)
		return fmt.Errorf("digest mismatch: want %s got %s", s.SHA256, got)
	}
	return nil
}

func (r *Runner) httpGet(ctx context.Context, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	c := r.HTTPClient
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	return resp.Body, nil
}

// ociLayer opens the binary in ref's first layer, pulled with the
// credentials creds holds for its registry (anonymous if none).
func (r *Runner) ociLayer(ctx context.Context, ref string, creds map[string]nodejobwire.Credential) (io.ReadCloser, error) {
	n, err := name.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	auth, user := registryauth.For(creds, n)
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(auth)}
	if r.HTTPClient != nil && r.HTTPClient.Transport != nil {
		opts = append(opts, remote.WithTransport(r.HTTPClient.Transport))
	}
	img, err := remote.Image(n, opts...)
	if err != nil {
		return nil, registryauth.Explain(err, n.Context().RegistryStr(), user)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	if len(layers) == 0 {
		return nil, errors.New("the image has no layer")
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(rc, 1024)
	head, _ := br.Peek(262)
	if len(head) < 262 || !bytes.HasPrefix(head[257:], []byte("ustar")) {
		return readCloser{br, rc}, nil // the raw binary
	}
	tr := tar.NewReader(br)
	for {
		h, err := tr.Next()
		if err != nil {
			rc.Close()
			if err == io.EOF {
				err = errors.New("the layer's tar holds no file")
			}
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			return readCloser{&oneFile{tr: tr}, rc}, nil
		}
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

// oneFile reads a tar's current file and fails at its end if another
// regular file follows: an upgrade artifact holds exactly one.
type oneFile struct{ tr *tar.Reader }

func (o *oneFile) Read(p []byte) (int, error) {
	n, err := o.tr.Read(p)
	if err != io.EOF {
		return n, err
	}
	for {
		h, nerr := o.tr.Next()
		if nerr == io.EOF {
			return n, io.EOF
		}
		if nerr != nil {
			return n, nerr
		}
		if h.Typeflag == tar.TypeReg {
			return n, fmt.Errorf("the layer's tar holds more than one file (%s)", h.Name)
		}
	}
}

// writeFile writes r to path durably (temp file, fsync, rename, fsync of the
// directory) with mode, and returns the sha256 of what it wrote. At most
// MaxBinaryBytes are accepted.
func writeFile(path string, r io.Reader, mode os.FileMode) (string, error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, MaxBinaryBytes+1))
	if err == nil && n > MaxBinaryBytes {
		err = fmt.Errorf("larger than %d bytes", MaxBinaryBytes)
	}
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), syncDir(dir)
}

// install copies src over dst atomically: a reader of dst sees the old or
// the new file, never a part, and after a power cut one of the two.
func install(src, dst string, mode os.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	_, err = writeFile(dst, f, mode)
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err // EINVAL: the file system cannot sync directories
	}
	return nil
}

func sameContent(a, b string) (bool, error) {
	ha, err := fileSHA256(a)
	if err != nil {
		return false, err
	}
	hb, err := fileSHA256(b)
	if err != nil {
		return false, err
	}
	return ha == hb, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// probeAttempts bounds the retries of a probe that hit ETXTBSY: a fork by
// another goroutine can briefly hold a just-written file open for writing.
const probeAttempts = 5

// probe runs `<path> --version` (argv, no shell) and checks it prints want.
// Its timeout stays on the wall clock (it bounds a real process); the pause
// before a retry is clk's.
func probe(ctx context.Context, clk clock.Clock, path, want string) error {
	var (
		out, errOut bytes.Buffer
		err         error
	)
	for attempt := 0; attempt < probeAttempts; attempt++ {
		out.Reset()
		errOut.Reset()
		pctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
		cmd := exec.CommandContext(pctx, path, "--version")
		cmd.Stdout, cmd.Stderr = &out, &errOut
		cmd.WaitDelay = time.Second // a child holding the pipes cannot stall us
		err = cmd.Run()
		cancel()
		if !errors.Is(err, syscall.ETXTBSY) {
			break
		}
		t := clk.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.Chan():
		}
		t.Stop()
	}
	if err != nil {
		msg := strings.TrimSpace(errOut.String())
		if len(msg) > 200 {
			msg = msg[:200]
		}
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", ProbeTimeout)
		}
		if msg != "" {
			return fmt.Errorf("probe %s: `%s --version`: %v: %s", want, filepath.Base(path), err, msg)
		}
		return fmt.Errorf("probe %s: `%s --version`: %v", want, filepath.Base(path), err)
	}
	if got := strings.TrimSpace(out.String()); got != want {
		return fmt.Errorf("probe %s: `%s --version` printed %q", want, filepath.Base(path), nodejobwire.Clip(got, 64))
	}
	return nil
}

// fileSafe keeps a version usable in a file name (versions are validated,
// but CurrentVersion is whatever the binary was built with).
func fileSafe(v string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '+', r == '_':
			return r
		}
		return '_'
	}, v)
}
