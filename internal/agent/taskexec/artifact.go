package taskexec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/drover-fleet/drover/internal/task/wire"
)

// fetchArtifacts downloads each artifact into dir and checks its digest.
// Files are written through an os.Root, which refuses a path that leaves
// dir, by ".." or through a symlink.
func (d *Driver) fetchArtifacts(ctx context.Context, dir string, arts []wire.Artifact) error {
	if len(arts) == 0 {
		return nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open working dir %s: %w", dir, err)
	}
	defer root.Close()
	for i, a := range arts {
		if err := d.fetch(ctx, root, a); err != nil {
			return fmt.Errorf("artifact %d (%s): %w", i, a.Path, err)
		}
	}
	return nil
}

func (d *Driver) fetch(ctx context.Context, root *os.Root, a wire.Artifact) error {
	if !filepath.IsLocal(a.Path) {
		return fmt.Errorf("path %q is not inside the working dir", a.Path)
	}
	if parent := filepath.Dir(a.Path); parent != "." {
		if err := root.MkdirAll(parent, 0o755); err != nil {
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
	tmp := a.Path + ".drover-tmp"
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		root.Remove(tmp)
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
	if err := root.Rename(tmp, a.Path); err != nil {
		root.Remove(tmp)
		return err
	}
	return nil
}
