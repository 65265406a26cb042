package demo

import (
	"context"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// PodCountAnnotation holds the number of pods CountPods saw.
const PodCountAnnotation = "demo.drover.dev/pods"

// waitForPods is how long to wait before looking again when there are no
// pods yet.
const waitForPods = 30 * time.Second

// Impl implements AppManagerImpl for one reconcile.
type Impl struct {
	client client.Client
	target *corev1.ConfigMap
}

var _ AppManagerImpl = (*Impl)(nil)

// NewImpl returns the actions for target.
func NewImpl(c client.Client, target *corev1.ConfigMap) AppManagerImpl {
	return &Impl{client: c, target: target}
}

// Workflow is the demo's workflow: both actions, joined.
func Workflow(m *AppManager, _ *corev1.ConfigMap) ctrlkit.Action {
	return ctrlkit.Join(m.EnsureCreds(), m.CountPods())
}

// EnsureCreds implements AppManagerImpl.
func (i *Impl) EnsureCreds(ctx context.Context, logger logr.Logger, creds *corev1.Secret) (reconcile.Result, error) {
	if creds != nil {
		return ctrlkit.NoRequeue()
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: i.target.Namespace, Name: i.target.Name + "-creds"}}
	if err := controllerutil.SetControllerReference(i.target, s, i.client.Scheme()); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("own secret", err)
	}
	logger.Info("creating credentials", "secret", s.Name)
	return ctrlkit.RequeueIfErrorAndWrap("create secret "+s.Name, i.client.Create(ctx, s))
}

// CountPods implements AppManagerImpl.
func (i *Impl) CountPods(ctx context.Context, logger logr.Logger, pods []corev1.Pod) (reconcile.Result, error) {
	patch := client.MergeFrom(i.target.DeepCopy())
	if i.target.Annotations == nil {
		i.target.Annotations = map[string]string{}
	}
	i.target.Annotations[PodCountAnnotation] = strconv.Itoa(len(pods))
	if err := i.client.Patch(ctx, i.target, patch); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("record pod count", err)
	}
	if len(pods) == 0 {
		return ctrlkit.RequeueAfter(waitForPods)
	}
	return ctrlkit.NoRequeue()
}
