package sessionapi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/serverless/appctl"
)

// AppctlOpener opens sessions through the manager's Application
// controller, turning its refusals into the session API's codes.
type AppctlOpener struct{ Controller *appctl.Controller }

// Open implements Opener.
func (o AppctlOpener) Open(ctx context.Context, namespace, app string, data map[string]string, openTimeout *time.Duration) (*serverlessv1.ApplicationSession, error) {
	s, err := o.Controller.Open(ctx, namespace, app, data, openTimeout)
	switch {
	case err == nil:
		return s, nil
	case errors.Is(err, appctl.ErrApplicationNotFound):
		return nil, status.Error(codes.NotFound, err.Error())
	case errors.Is(err, appctl.ErrApplicationIsDaemon):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, appctl.ErrNoCapacity):
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	return nil, err
}
