package ctrlkitotel_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/drover-fleet/drover/pkg/ctrlkit"
	"github.com/drover-fleet/drover/pkg/ctrlkit/ctrlkitotel"
)

func TestSpansFollowTheWorkflow(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	ok := ctrlkit.NewAction("ok", func(context.Context) (reconcile.Result, error) { return ctrlkit.RequeueAfter(1500_000_000) })
	bad := ctrlkit.NewAction("bad", func(context.Context) (reconcile.Result, error) {
		return ctrlkit.RequeueIfError(errors.New("boom"))
	})
	exit := ctrlkit.NewAction("exit", func(context.Context) (reconcile.Result, error) { return ctrlkit.Exit() })
	wf := ctrlkit.Instrument(ctrlkit.Join(ok, bad, exit), ctrlkit.InstrumentOptions{
		Observer: ctrlkitotel.NewObserver(tp.Tracer("test")),
	})
	_, _ = wf.Run(t.Context())

	spans := sr.Ended()
	if len(spans) != 4 {
		t.Fatalf("Join(ok, bad, exit) recorded %d spans, want 4", len(spans))
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	root := byName["Join"]
	for _, name := range []string{"ok", "bad", "exit"} {
		s := byName[name]
		if s == nil || s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("span %q is missing or not a child of Join", name)
		}
	}
	rows := []struct {
		name    string
		outcome string
		status  codes.Code
	}{
		{"ok", "requeueAfter", codes.Unset},
		{"bad", "error", codes.Error},
		{"exit", "exit", codes.Unset},
		{"Join", "error", codes.Error},
	}
	for _, row := range rows {
		s := byName[row.name]
		var outcome string
		for _, kv := range s.Attributes() {
			if kv.Key == ctrlkitotel.KeyOutcome {
				outcome = kv.Value.AsString()
			}
		}
		if outcome != row.outcome || s.Status().Code != row.status {
			t.Errorf("span %s = {outcome %q, status %v}, want {%q, %v}", row.name, outcome, s.Status().Code, row.outcome, row.status)
		}
	}
}
