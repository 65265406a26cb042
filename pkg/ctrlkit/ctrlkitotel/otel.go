// Package ctrlkitotel records ctrlkit actions as OpenTelemetry spans.
//
// It is a separate package so that pkg/ctrlkit itself depends on
// controller-runtime and the standard library only; import it where the
// tracer provider is set up:
//
//	wf = ctrlkit.Instrument(wf, ctrlkit.InstrumentOptions{
//		Observer: ctrlkitotel.NewObserver(tp.Tracer("drover/controllers")),
//	})
//
// Every action becomes a span named after it (ctrlkit.NameOf), child of the
// span of the combinator that ran it, with attributes for the description,
// the outcome and the requeue delay. Errors, timeouts and panics set the
// span status to Error; an exit does not, because it is not a failure.
package ctrlkitotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Attribute keys set on every span.
const (
	KeyDescription  = attribute.Key("ctrlkit.description")
	KeyOutcome      = attribute.Key("ctrlkit.outcome")
	KeyRequeueAfter = attribute.Key("ctrlkit.requeue_after_ms")
)

// maxDescription bounds the description attribute: a combinator's
// description lists its children and grows with the workflow.
const maxDescription = 256

// NewObserver returns an observer that records each action as a span from
// tracer.
func NewObserver(tracer trace.Tracer) ctrlkit.Observer {
	return observer{tracer: tracer}
}

type observer struct {
	tracer trace.Tracer
}

var _ ctrlkit.Observer = observer{}

func (o observer) ObserveAction(ctx context.Context, a ctrlkit.Action) (context.Context, func(ctrlkit.Report)) {
	desc := a.Description()
	if len(desc) > maxDescription {
		desc = desc[:maxDescription] + "…"
	}
	ctx, span := o.tracer.Start(ctx, ctrlkit.NameOf(a), trace.WithAttributes(KeyDescription.String(desc)))
	return ctx, func(r ctrlkit.Report) {
		span.SetAttributes(KeyOutcome.String(r.Outcome.String()))
		if r.Result.RequeueAfter > 0 {
			span.SetAttributes(KeyRequeueAfter.Int64(r.Result.RequeueAfter.Milliseconds()))
		}
		switch r.Outcome {
		case ctrlkit.OutcomePanic:
			span.RecordError(r.Panic)
			span.SetStatus(codes.Error, "panic")
		case ctrlkit.OutcomeError, ctrlkit.OutcomeTimeout:
			span.RecordError(r.Err)
			span.SetStatus(codes.Error, r.Err.Error())
		}
		span.End()
	}
}
