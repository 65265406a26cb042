package taskhub

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// LogTarget implements hub.LogFinder: it finds the node and work id of
// attempt (0: the current one) of the task namespace/name, for the hub's
// TaskLogs.
func (d *Dispatcher) LogTarget(ctx context.Context, namespace, name string, attempt int32) (node, uid string, err error) {
	var t batchv1.Task
	if err := d.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &t); err != nil {
		return "", "", err
	}
	node, err = batchv1.AttemptNode(&t, attempt)
	if err != nil {
		return "", "", status.Error(codes.FailedPrecondition, err.Error())
	}
	if attempt == 0 {
		attempt = t.Status.Attempt
	}
	return node, taskwire.WorkID(string(t.UID), attempt), nil
}
