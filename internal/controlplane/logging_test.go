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
