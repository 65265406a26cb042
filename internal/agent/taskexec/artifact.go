package taskexec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// fetchArtifacts downloads each artifact into dir and checks its digest.
// Files are written through an os.Root, which refuses a path that leaves
// dir, by ".." or through a symlink, and then given to u (with the dirs
// made for them), so the task owns what it works on.
func (d *Driver) fetchArtifacts(ctx context.Context, dir string, arts []taskwire.Artifact, u User) error {
	if len(arts) == 0 {
		return nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open working dir %s: %w", dir, err)
	}
	defer root.Close()
	for i, a := range arts {
		if err := d.fetch(ctx, root, a, u); err != nil {
			return fmt.Errorf("artifact %d (%s): %w", i, a.Path, err)
		}
	}
	return nil
}

func (d *Driver) fetch(ctx context.Context, root *os.Root, a taskwire.Artifact, u User) error {
	if !filepath.IsLocal(a.Path) {
		return fmt.Errorf("path %q is not inside the working dir", a.Path)
	}
	if parent := filepath.Dir(a.Path); parent != "." {
		if err := d.mkdirOwned(root, parent, u); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
	if err != nil {
		return err
	}
	resp, err := d.opts.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch %s: HTTP %s", a.URL, resp.Status)
	}
	limit := d.opts.MaxArtifactBytes
	// An announced size over the limit fails before any byte is read; the
	// announcement may be missing or false (chunked, or gzip that the
	// transport decodes), so the copy below counts too.
	if resp.ContentLength > limit {
		return &tooLargeError{url: a.URL, limit: limit, size: resp.ContentLength}
	}
	tmp := a.Path + ".drover-tmp"
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	h := sha256.New()
	// One byte past the limit tells an artifact over it from one exactly at it.
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, limit+1))
	if err == nil && n > limit {
		err = &tooLargeError{url: a.URL, limit: limit}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		root.Remove(tmp)
		var tl *tooLargeError
		if errors.As(err, &tl) {
			return err
		}
		return fmt.Errorf("fetch %s: %w", a.URL, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		root.Remove(tmp)
		return fmt.Errorf("fetch %s: sha256 is %s, want %s", a.URL, got, a.SHA256)
	}
	mode := os.FileMode(0o644)
	if a.Executable {
		mode = 0o755
	}
	if err := root.Chmod(tmp, mode); err != nil {
		root.Remove(tmp)
		return err
	}
	if err := d.chown(root, tmp, u); err != nil {
		root.Remove(tmp)
		return err
	}
	if err := root.Rename(tmp, a.Path); err != nil {
		root.Remove(tmp)
		return err
	}
	return nil
}

// tooLargeError is an artifact over Options.MaxArtifactBytes.
type tooLargeError struct {
	url   string
	limit int64
	size  int64 // announced by Content-Length; 0 when found while reading
}

func (e *tooLargeError) Error() string {
	what := "is larger than"
	if e.size > 0 {
		what = fmt.Sprintf("announces %d bytes, more than", e.size)
	}
	return fmt.Sprintf("fetch %s: the artifact %s the agent's limit of %d bytes (%s; drover-agent --max-artifact-bytes)",
		e.url, what, e.limit, byteSize(e.limit))
}

// byteSize is n for people: 1 GiB, 1.5 MiB, 10 B.
func byteSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < 5 {
		v /= 1024
		i++
	}
	return strconv.FormatFloat(v, 'g', 4, 64) + " " + "KMGTPE"[i:i+1] + "iB"
}
