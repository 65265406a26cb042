// Package tenancyadmit enforces the tenancy policy (NodeGrants, see
// internal/tenancy) at admission: a validating webhook, served by the
// manager, that refuses a Task, TaskGroup or FleetJob whose namespace may
// not run that work, or not on the node it names. The scheduler enforces
// the same policy again when it places work; admission makes the refusal
// immediate and names the policy.
//
// The webhook fails closed (failurePolicy Fail): while no manager serves
// it, Tasks, TaskGroups and FleetJobs can be neither created nor have
// their spec changed. Its matchConditions keep every update that leaves
// spec alone (finalizers, labels, deletion) away from it, so a down
// manager never blocks a delete, a finalizer or a status write.
//
// A Task naming a node (spec.nodeName) whose FleetNode does not exist is
// checked as a Task without a node (Access.Check: some grant of its
// namespace must allow its user, group and working dir): the node may
// register later, and the scheduler checks it against that node's labels
// before it runs there.
package tenancyadmit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/tenancy"
)

// Results of the drover_tenancy_admission_total counter.
const (
	ResultAllowed = "allowed"
	ResultDenied  = "denied"
	ResultError   = "error"
)

// Handler decides admission requests for Tasks, TaskGroups and FleetJobs.
type Handler struct {
	// Cache reads Namespaces and FleetNodes (the manager's cache).
	cache client.Reader
	// api reads the API server directly: what the cache has not seen yet.
	api      client.Reader
	policy   *policyCache
	log      *slog.Logger
	decision *prometheus.CounterVec
	// probeNS is where the server's dry-run probe Task is made.
	probeNS string
}

// newHandler returns a Handler reading Namespaces and FleetNodes from
// cache, NodeGrants through policy, and the API server (api) where the
// cache may lag: an object the cache does not hold, and a refusal, which
// is checked once more against the API server's current grants so that a
// grant just created applies at once.
func newHandler(cache, api client.Reader, policy *policyCache, probeNS string, log *slog.Logger, reg prometheus.Registerer) *Handler {
	h := &Handler{cache: cache, api: api, policy: policy, log: log, probeNS: probeNS,
		decision: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_tenancy_admission_total",
			Help: "Admission decisions of the tenancy webhook (NodeGrants) on Tasks, TaskGroups and FleetJobs, by kind and result (allowed, denied, error).",
		}, []string{"kind", "result"})}
	if reg != nil {
		reg.MustRegister(h.decision)
	}
	return h
}

// located is one task spec of an object and where it sits in it.
type located struct {
	path string
	spec *batchv1.TaskSpec
}

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	kind := req.Kind.Kind
	if kind == "Task" && req.Name == probeName && req.Namespace == h.probeNS && ptr.Deref(req.DryRun, false) {
		// Nothing is stored: a dry run.
		return admission.Denied(probeAnswer)
	}
	specs, err := taskSpecs(kind, req.Object.Raw)
	if err != nil {
		h.decision.WithLabelValues(kind, ResultError).Inc()
		return admission.Errored(http.StatusBadRequest, err)
	}
	denial, err := h.decide(ctx, req.Namespace, specs)
	if err != nil {
		h.decision.WithLabelValues(kind, ResultError).Inc()
		h.log.Error("tenancy admission failed", "kind", kind, "namespace", req.Namespace, "name", req.Name, "err", err)
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if denial != "" {
		h.decision.WithLabelValues(kind, ResultDenied).Inc()
		h.log.Info("tenancy admission denied", "kind", kind, "namespace", req.Namespace, "name", req.Name, "user", req.UserInfo.Username, "why", denial)
		return admission.Denied(denial)
	}
	h.decision.WithLabelValues(kind, ResultAllowed).Inc()
	return admission.Allowed("")
}

// taskSpecs decodes the object and returns its task specs.
func taskSpecs(kind string, raw []byte) ([]located, error) {
	switch kind {
	case "Task":
		var t batchv1.Task
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("decode Task: %w", err)
		}
		return []located{{"spec", &t.Spec}}, nil
	case "TaskGroup":
		var g batchv1.TaskGroup
		if err := json.Unmarshal(raw, &g); err != nil {
			return nil, fmt.Errorf("decode TaskGroup: %w", err)
		}
		if len(g.Spec.Tasks) > 0 {
			out := make([]located, len(g.Spec.Tasks))
			for i := range g.Spec.Tasks {
				out[i] = located{fmt.Sprintf("spec.tasks[%s].spec", g.Spec.Tasks[i].Name), &g.Spec.Tasks[i].Spec}
			}
			return out, nil
		}
		return []located{{"spec.template.spec", &g.Spec.Template.Spec}}, nil
	case "FleetJob":
		var j batchv1.FleetJob
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, fmt.Errorf("decode FleetJob: %w", err)
		}
		out := make([]located, len(j.Spec.TaskGroups))
		for i := range j.Spec.TaskGroups {
			g := &j.Spec.TaskGroups[i]
			out[i] = located{fmt.Sprintf("spec.taskGroups[%s].template.spec", g.Name), &g.Template.Spec}
		}
		return out, nil
	}
	return nil, fmt.Errorf("the tenancy webhook does not check kind %q: only Task, TaskGroup and FleetJob (batch.drover.io)", kind)
}

// decide returns why the namespace may not run specs, or "". A refusal by
// the cached grants is checked again against the API server's.
func (h *Handler) decide(ctx context.Context, ns string, specs []located) (string, error) {
	p, err := h.policy.get(ctx)
	if err != nil {
		return "", err
	}
	denial, err := h.check(ctx, p, false, ns, specs)
	if denial == "" || err != nil {
		return denial, err
	}
	if p, err = h.policy.fresh(ctx); err != nil {
		return "", err
	}
	return h.check(ctx, p, true, ns, specs)
}

// check evaluates specs with policy p, reading the Namespace and the
// FleetNodes from the cache (and the API server where it does not hold
// them), or only from the API server when fresh.
func (h *Handler) check(ctx context.Context, p *tenancy.Policy, fresh bool, ns string, specs []located) (string, error) {
	var nsObj corev1.Namespace
	if err := h.get(ctx, fresh, client.ObjectKey{Name: ns}, &nsObj); err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("read namespace %s: %w", ns, err)
	}
	access := p.For(ns, nsObj.Labels)
	var first string
	denied := 0
	for _, s := range specs {
		w := tenancy.Work{WorkingDir: s.spec.WorkingDir}
		if s.spec.Driver == batchv1.DriverContainerd {
			w.WorkingDir = "" // a dir inside the container, not the node's
		}
		if sc := s.spec.SecurityContext; sc != nil {
			w.RunAsUser, w.RunAsGroup = sc.RunAsUser, sc.RunAsGroup
		}
		var err error
		if name := s.spec.NodeName; name != "" {
			var node fleetv1.FleetNode
			switch gerr := h.get(ctx, fresh, client.ObjectKey{Name: name}, &node); {
			case gerr == nil:
				err = access.CheckNode(w, name, node.Labels)
			case apierrors.IsNotFound(gerr):
				// It may register later; the scheduler checks its labels
				// before anything runs there.
				err = access.Check(w)
			default:
				return "", fmt.Errorf("read FleetNode %s: %w", name, gerr)
			}
		} else {
			err = access.Check(w)
		}
		if err != nil {
			if denied == 0 {
				first = s.path + ": " + err.Error()
			}
			denied++
		}
	}
	switch denied {
	case 0:
		return "", nil
	case 1:
		return first, nil
	}
	return fmt.Sprintf("%s (and %d more task groups refused)", first, denied-1), nil
}

// get reads key from the cache, then from the API server if the cache
// does not hold it (yet); only from the API server when fresh.
func (h *Handler) get(ctx context.Context, fresh bool, key client.ObjectKey, obj client.Object) error {
	if fresh {
		return h.api.Get(ctx, key, obj)
	}
	err := h.cache.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		err = h.api.Get(ctx, key, obj)
	}
	return err
}
