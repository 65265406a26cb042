package inplacectl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Hook calls.
const (
	defaultHookTimeout = 10 * time.Second
	maxAnswerBytes     = 1 << 20
	// hookRetry is how soon an unreachable hook is called again, within
	// the request's answer timeout.
	hookRetry = 5 * time.Second
)

// HookRequest is the body Drover POSTs to an updater's HTTP hook.
type HookRequest struct {
	APIVersion string                    `json:"apiVersion"`
	Kind       string                    `json:"kind"`
	Name       string                    `json:"name"`
	Pool       string                    `json:"pool"`
	Revision   string                    `json:"revision"`
	Changes    []updatev1.Responsibility `json:"changes"`
	Nodes      int32                     `json:"nodes"`
}

// RequestReconciler gathers the registered updaters' answers to an
// ExternalUpdateRequest and makes its InPlaceUpdatePlan.
type RequestReconciler struct {
	Options
	// AnswerTimeout bounds the wait for answers; 0 means
	// inplace.DefaultAnswerTimeout.
	AnswerTimeout time.Duration
}

// +kubebuilder:rbac:groups=update.drover.io,resources=externalupdaterequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=update.drover.io,resources=externalupdaterequests/status,verbs=patch
// +kubebuilder:rbac:groups=update.drover.io,resources=updaterregistrations,verbs=get;list;watch
// +kubebuilder:rbac:groups=update.drover.io,resources=inplaceupdateplans,verbs=get;list;watch;create

// SetupWithManager registers the controller: a request is reconciled when
// it changes (an updater answered) and when registrations change.
func (r *RequestReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	pending := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var l updatev1.ExternalUpdateRequestList
		if err := r.Client.List(ctx, &l); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, q := range l.Items {
			if q.Status.Phase == "" || q.Status.Phase == updatev1.RequestPending {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&q)})
			}
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).Named("externalupdaterequest").
		For(&updatev1.ExternalUpdateRequest{}).
		Watches(&updatev1.UpdaterRegistration{}, pending).
		Complete(r.generated())
}

// Reconcile implements reconcile.Reconciler.
func (r *RequestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

func (r *RequestReconciler) generated() *RequestManagerReconciler {
	return &RequestManagerReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, q *updatev1.ExternalUpdateRequest) RequestManagerImpl {
			return &requestImpl{Options: r.Options, timeout: r.AnswerTimeout, req: q, before: q.DeepCopy()}
		},
		Workflow: func(m *RequestManager, q *updatev1.ExternalUpdateRequest) ctrlkit.Action {
			ended := q.Status.Phase != "" && q.Status.Phase != updatev1.RequestPending
			return ctrlkit.Sequential(ctrlkit.ExitIf(ended || q.DeletionTimestamp != nil), m.CollectAnswers(), m.Plan(), m.UpdateStatus())
		},
		Observer: r.Observer,
	}
}

type requestImpl struct {
	Options
	timeout     time.Duration
	req, before *updatev1.ExternalUpdateRequest
	regs        []inplace.Registration
	unreachable map[string]string
	decision    inplace.RequestDecision
}

var _ RequestManagerImpl = (*requestImpl)(nil)

func (i *requestImpl) changes() []inplace.Change {
	out := make([]inplace.Change, 0, len(i.req.Spec.Changes))
	for _, c := range i.req.Spec.Changes {
		out = append(out, inplace.Change{Path: c.Path, SelectResource: c.SelectResource, Value: c.Value})
	}
	return out
}

// CollectAnswers implements RequestManagerImpl.
func (i *requestImpl) CollectAnswers(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	var regs updatev1.UpdaterRegistrationList
	if err := i.Client.List(ctx, &regs); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list updater registrations", err)
	}
	answered := map[string]bool{}
	for _, a := range i.req.Status.Answers {
		answered[a.UpdaterName] = true
	}
	i.unreachable = map[string]string{}
	changes := i.changes()
	for _, reg := range regs.Items {
		r := inplace.Registration{Name: reg.Name, Sequence: reg.Spec.Sequence, TemplateRef: reg.Spec.UpdaterUpdateTemplateRef, Claims: reg.Spec.Claims}
		i.regs = append(i.regs, r)
		if answered[reg.Name] || len(changes) == 0 {
			continue
		}
		switch {
		case len(reg.Spec.Claims) > 0:
			i.addAnswer(inplace.StaticAnswer(r, changes))
		case reg.Spec.HTTP != nil:
			a, err := i.callHook(ctx, reg.Spec.HTTP)
			if err != nil {
				logger.Info("update hook not answering", "updater", reg.Name, "error", err.Error())
				i.unreachable[reg.Name] = err.Error()
				continue
			}
			a.UpdaterName = reg.Name
			i.addAnswer(a)
		}
	}
	return ctrlkit.NoRequeue()
}

func (i *requestImpl) addAnswer(a updatev1.UpdaterAnswer) {
	i.req.Status.Answers = append(i.req.Status.Answers, a)
}

// callHook POSTs the request to an updater's hook and reads its answer.
func (i *requestImpl) callHook(ctx context.Context, h *updatev1.HTTPHook) (updatev1.UpdaterAnswer, error) {
	var a updatev1.UpdaterAnswer
	u, err := url.Parse(h.URL)
	if err != nil {
		return a, fmt.Errorf("hook url: %w", err)
	}
	if u.Scheme != "https" && !(u.Scheme == "http" && isLoopback(u.Hostname())) {
		return a, fmt.Errorf("hook url %s: https, or http only to a loopback address", h.URL)
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(h.CABundle) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(h.CABundle) {
			return a, errors.New("caBundle holds no PEM certificate")
		}
		tlsConfig.RootCAs = pool
	}
	timeout := defaultHookTimeout
	if h.TimeoutSeconds > 0 {
		timeout = time.Duration(h.TimeoutSeconds) * time.Second
	}
	hc := &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{TLSClientConfig: tlsConfig, Proxy: nil},
		// A hook answers; it does not send Drover elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer hc.CloseIdleConnections()
	body, err := json.Marshal(HookRequest{APIVersion: updatev1.GroupVersion.String(), Kind: "ExternalUpdateRequest", Name: i.req.Name,
		Pool: i.req.Spec.Pool, Revision: i.req.Spec.Revision, Changes: i.req.Spec.Changes, Nodes: i.req.Spec.Nodes})
	if err != nil {
		return a, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		return a, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(hr)
	if err != nil {
		return a, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return a, fmt.Errorf("hook answered HTTP %d", resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(&a); err != nil {
		return a, fmt.Errorf("hook answer is not an UpdaterAnswer: %w", err)
	}
	switch a.Status {
	case updatev1.AnswerAccept, updatev1.AnswerReject, updatev1.AnswerError:
	default:
		return a, fmt.Errorf("hook answered status %q: want accept, reject or error", a.Status)
	}
	if len(a.Message) > 1024 {
		a.Message = a.Message[:1021] + "..."
	}
	return a, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Plan implements RequestManagerImpl.
func (i *requestImpl) Plan(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	i.decision = inplace.StepRequest(inplace.RequestInput{Changes: i.changes(), Registrations: i.regs, Answers: i.req.Status.Answers,
		Created: i.req.CreationTimestamp.Time, Now: i.now(), AnswerTimeout: i.timeout, Unreachable: i.unreachable})
	if i.decision.Phase == updatev1.RequestPending && len(i.unreachable) > 0 {
		i.decision.RequeueAfter = min(i.decision.RequeueAfter, hookRetry)
	}
	if i.decision.Phase != updatev1.RequestPlanned {
		return ctrlkit.NoRequeue()
	}
	plan := &updatev1.InPlaceUpdatePlan{
		ObjectMeta: metav1.ObjectMeta{Name: i.req.Name, Labels: map[string]string{updatev1.LabelRequest: i.req.Name, updatev1.LabelPool: i.req.Spec.Pool}},
		Spec: updatev1.InPlaceUpdatePlanSpec{UpdatePhase: updatev1.PhaseUpdating,
			Pools: []updatev1.PlanPool{{Name: i.req.Spec.Pool, Sequence: 1}}, Updaters: i.decision.Updaters},
	}
	if err := controllerutil.SetControllerReference(i.req, plan, i.Client.Scheme()); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("own plan", err)
	}
	if err := i.Client.Create(ctx, plan); err != nil && !apierrors.IsAlreadyExists(err) {
		return ctrlkit.RequeueIfErrorAndWrap("create plan", err)
	}
	i.req.Status.Plan = plan.Name
	logger.Info("update request planned", "plan", plan.Name, "updaters", len(plan.Spec.Updaters))
	return ctrlkit.NoRequeue()
}

// UpdateStatus implements RequestManagerImpl.
func (i *requestImpl) UpdateStatus(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	d := i.decision
	st := &i.req.Status
	st.Phase = d.Phase
	setCondition(&st.Conditions, "Ready", boolStatus(d.Phase == updatev1.RequestPlanned || d.Phase == updatev1.RequestUpdated), d.Reason, d.Message, i.req.Generation)
	if err := i.Client.Status().Patch(ctx, i.req, client.MergeFromWithOptions(i.before, client.MergeFromWithOptimisticLock{})); err != nil {
		// An updater wrote its answer meanwhile: look again.
		return requeueOnConflict(err)
	}
	if i.before.Status.Phase != d.Phase {
		typ := corev1.EventTypeNormal
		if d.Phase == updatev1.RequestFailed {
			typ = corev1.EventTypeWarning
		}
		if c := meta.FindStatusCondition(st.Conditions, "Ready"); c != nil {
			i.event(i.req, typ, c.Reason, c.Message)
		}
	}
	return ctrlkit.RequeueAfter(d.RequeueAfter)
}
