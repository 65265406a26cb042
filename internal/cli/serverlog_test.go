package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/drover-fleet/drover/internal/testkit"
)

// By default the terminal gets warnings and errors, the file everything;
// --verbose puts everything on the terminal too.
func TestServerLoggerLevels(t *testing.T) {
	for _, verbose := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "data")
		var term bytes.Buffer
		g := &globalOptions{logLevel: "info"}
		sl, err := g.serverLogger(&term, dir, verbose)
		if err != nil {
			t.Fatal(err)
		}
		sl.Info("Starting EventSource")
		sl.Warn("hub is slow")
		if err := sl.Close(); err != nil {
			t.Fatal(err)
		}
		file, err := os.ReadFile(filepath.Join(dir, serverLogName))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(file), "Starting EventSource") || !strings.Contains(string(file), "hub is slow") {
			t.Errorf("verbose=%v: %s holds\n%s\nwant the info and the warning", verbose, serverLogName, file)
		}
		if got := strings.Contains(term.String(), "Starting EventSource"); got != verbose {
			t.Errorf("verbose=%v: info on the terminal = %v:\n%s", verbose, got, term.String())
		}
		if !strings.Contains(term.String(), "hub is slow") {
			t.Errorf("verbose=%v: the terminal misses the warning:\n%s", verbose, term.String())
		}
	}
}

// controller-runtime's "leader election lost" after a stop we asked for is
// no error; the same record while running is.
func TestServerLoggerStop(t *testing.T) {
	var term bytes.Buffer
	g := &globalOptions{logLevel: "info"}
	sl, err := g.serverLogger(&term, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer sl.stopOn(ctx)()
	cr := logr.FromSlogHandler(sl.Handler())
	lost := errors.New(leaseLostError)
	cr.Error(lost, stopSequenceMessage)
	if !strings.Contains(term.String(), "level=ERROR") {
		t.Fatalf("a lease lost while running is not an error on the terminal:\n%s", term.String())
	}
	term.Reset()
	cancel()
	// AfterFunc runs in a goroutine of its own: wait for it.
	testkit.Eventually(t, testkit.DefaultTimeout, func() string {
		if !sl.stopping.Load() {
			return "the stop is not marked ours"
		}
		return ""
	})
	cr.Error(lost, stopSequenceMessage)
	cr.Error(errors.New("webhook server failed"), stopSequenceMessage)
	out := term.String()
	if strings.Contains(out, leaseLostError) {
		t.Errorf("the lease lost on our own stop reached the terminal:\n%s", out)
	}
	if !strings.Contains(out, "webhook server failed") {
		t.Errorf("another error after the stop was hidden:\n%s", out)
	}
}
