package controlplane

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func TestTeeHandlerForwardsOnlyErrors(t *testing.T) {
	var file, operator bytes.Buffer
	log := slog.New(newTeeHandler(&file, slog.LevelInfo, slog.NewTextHandler(&operator, nil))).With("component", "kube-apiserver")
	log.Info("routine")
	log.Debug("chatty")
	log.Error("broken", "err", errors.New("disk full"))

	if !strings.Contains(file.String(), "routine") || !strings.Contains(file.String(), "broken") {
		t.Errorf("file log = %q, want info and error lines", file.String())
	}
	if strings.Contains(file.String(), "chatty") {
		t.Errorf("file log = %q, want no debug lines", file.String())
	}
	if strings.Contains(operator.String(), "routine") {
		t.Errorf("operator log = %q, want only errors", operator.String())
	}
	if !strings.Contains(operator.String(), "broken") || !strings.Contains(operator.String(), "component=kube-apiserver") || !strings.Contains(operator.String(), "disk full") {
		t.Errorf("operator log = %q, want the error with its attributes", operator.String())
	}
}

func TestEtcdLoggerForwardsOnlyErrors(t *testing.T) {
	var file, operator bytes.Buffer
	lg := newEtcdLogger(&file, slog.NewTextHandler(&operator, nil).WithAttrs([]slog.Attr{slog.String("component", "etcd")}))
	lg = lg.With(zap.String("member", "drover"))
	lg.Info("applied", zap.Int("index", 7))
	lg.Warn("slow fsync")
	lg.Error("wal corrupt", zap.Error(errors.New("crc mismatch")))
	_ = lg.Sync()

	for _, want := range []string{"applied", "slow fsync", "wal corrupt"} {
		if !strings.Contains(file.String(), want) {
			t.Errorf("etcd file log lacks %q: %s", want, file.String())
		}
	}
	if strings.Contains(operator.String(), "applied") || strings.Contains(operator.String(), "slow fsync") {
		t.Errorf("operator log = %q, want only errors", operator.String())
	}
	for _, want := range []string{"wal corrupt", "crc mismatch", "member=drover", "component=etcd"} {
		if !strings.Contains(operator.String(), want) {
			t.Errorf("operator log lacks %q: %s", want, operator.String())
		}
	}
}

func TestErrGate(t *testing.T) {
	var out bytes.Buffer
	g := &errGate{}
	log := slog.New(g.handler(slog.NewTextHandler(&out, nil)))

	log.Error("noise while starting")
	if out.Len() != 0 {
		t.Fatalf("while starting: forwarded %q, want it held back", out.String())
	}
	g.serving()
	log.Error("real problem")
	g.stopping()
	log.Error("closed listener")
	got := out.String()
	if strings.Contains(got, "noise while starting") || strings.Contains(got, "closed listener") || !strings.Contains(got, "real problem") {
		t.Errorf("forwarded %q, want only the error logged while serving", got)
	}

	out.Reset()
	g = &errGate{}
	log = slog.New(g.handler(slog.NewTextHandler(&out, nil)))
	for i := 0; i < maxHeld+5; i++ {
		log.Error("start error", "i", i)
	}
	g.failed()
	if n := strings.Count(out.String(), "start error"); n != maxHeld {
		t.Errorf("after a failed start: forwarded %d held errors, want the last %d", n, maxHeld)
	}
	if strings.Contains(out.String(), "i=0 ") || !strings.Contains(out.String(), "i=54") {
		t.Errorf("after a failed start: forwarded %q, want the newest errors", out.String())
	}
}

// TestRetriedErrorsStayInTheFiles: the garbage collector's sync timeout,
// logged through utilruntime.HandleError while serving on a loaded
// machine, does not reach the operator; other errors do.
func TestRetriedErrorsStayInTheFiles(t *testing.T) {
	var out strings.Builder
	g := &errGate{}
	g.serving()
	log := slog.New(g.handler(slog.NewTextHandler(&out, nil)))
	log.Error("Unhandled Error", "err", errors.New("timed out waiting for dependency graph builder sync during GC sync"))
	log.Error("timed out waiting for dependency graph builder sync during GC sync")
	if out.Len() != 0 {
		t.Errorf("a retried error reached the operator: %s", out.String())
	}
	log.Error("Unhandled Error", "err", errors.New("etcd is gone"))
	if !strings.Contains(out.String(), "etcd is gone") {
		t.Errorf("another error did not reach the operator: %q", out.String())
	}
}
