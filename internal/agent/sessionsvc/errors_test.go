package sessionsvc

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// errorsCause is the innermost error (the SDK wraps the gRPC status).
func errorsCause(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

func TestClosedParent(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open", "s")
	closed := filepath.Join(base, "closed", "s")
	if err := os.MkdirAll(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(closed, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(closed), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(open), 0o711); err != nil {
		t.Fatal(err)
	}
	if got := closedParent(closed); got != filepath.Dir(closed) {
		t.Errorf("closedParent(%s) = %q, want %s", closed, got, filepath.Dir(closed))
	}
	// base itself (t.TempDir's) may be closed too: what matters is that
	// the open dir is not the one named.
	if got := closedParent(open); got == filepath.Dir(open) {
		t.Errorf("closedParent(%s) = %q, the 0711 dir", open, got)
	}
}
