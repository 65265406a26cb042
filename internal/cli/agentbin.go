package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// agentBinaryCopy gives one local agent of `drover up` a drover-agent of
// its own, dir/drover-agent, and returns its path. An agent upgrades
// itself by replacing the file it runs from (NodeUpgradeJob): with one
// shared binary, upgrading node-1 would upgrade every local node at its
// next start.
//
// The copy is made again only when src changed since the last copy (its
// size, modification time or path, kept in dir/drover-agent.source), so a
// node that upgraded itself keeps its version across restarts, and a
// rebuilt drover-agent reaches every node.
func agentBinaryCopy(src, dir string) (string, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return "", fmt.Errorf("drover-agent binary: %w", err)
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "drover-agent")
	stampPath := dst + ".source"
	stamp := strings.Join([]string{abs, strconv.FormatInt(fi.Size(), 10), strconv.FormatInt(fi.ModTime().UnixNano(), 10)}, "\n") + "\n"
	if old, err := os.ReadFile(stampPath); err == nil && string(old) == stamp {
		if _, err := os.Stat(dst); err == nil {
			return dst, nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := copyExecutable(src, dst); err != nil {
		return "", fmt.Errorf("copy drover-agent to %s: %w", dst, err)
	}
	if err := os.WriteFile(stampPath, []byte(stamp), 0o600); err != nil {
		return "", err
	}
	return dst, nil
}

// copyExecutable copies src over dst by rename, as an agent may still run
// from the old dst (its text cannot be written while it runs).
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	_, err = io.Copy(tmp, in)
	if err == nil {
		err = tmp.Chmod(0o755)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
