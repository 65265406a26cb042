package inplacectl_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace"
	"github.com/drover-fleet/drover/internal/inplace/inplacectl"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestTemplateChangeAsksUpdatersAndPlans: with autoUpdate, a change to a
// pool's template becomes an ExternalUpdateRequest; one updater answers
// through its registration's claims, another through an HTTP hook; the
// plan made from the answers updates the pool. A newer change aborts the
// running plan, and a change nobody claims fails naming the path.
func TestTemplateChangeAsksUpdatersAndPlans(t *testing.T) {
	testenv.Require(t, env)
	installUpdaterCRDs(t)
	ctx := context.Background()
	x := uniq("topo")
	startManager(t)
	nodes(t, x, x+"-1", x+"-2")

	files := template(t, x+"-files", map[string]any{})
	agent := template(t, x+"-agent", map[string]any{})
	holding := template(t, x+"-hold", map[string]any{"hold": true})
	var mu sync.Mutex
	var calls []inplacectl.HookRequest
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req inplacectl.HookRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		calls = append(calls, req)
		first := len(calls) == 1
		mu.Unlock()
		a := updatev1.UpdaterAnswer{Status: updatev1.AnswerReject, Message: "no agent version change"}
		for _, c := range req.Changes {
			if c.Path == inplace.PathAgentVersion {
				a = updatev1.UpdaterAnswer{Status: updatev1.AnswerAccept, Responsibilities: []string{c.Path}}
				if first {
					// The first plan holds, so that the next change finds it running.
					a.UpdateTaskTemplateRef = &holding
				}
			}
		}
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(hook.Close)
	regs := []*updatev1.UpdaterRegistration{
		{ObjectMeta: metav1.ObjectMeta{Name: x + "-files"}, Spec: updatev1.UpdaterRegistrationSpec{Sequence: 1, UpdaterUpdateTemplateRef: &files, Claims: []string{"/files/"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: x + "-agent"}, Spec: updatev1.UpdaterRegistrationSpec{Sequence: 2, UpdaterUpdateTemplateRef: &agent, HTTP: &updatev1.HTTPHook{URL: hook.URL}}},
	}
	for _, r := range regs {
		if err := env.Client.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		// Registrations are cluster-wide: leave none for other tests.
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), r) })
	}
	bad := &updatev1.UpdaterRegistration{ObjectMeta: metav1.ObjectMeta{Name: x + "-bad"}, Spec: updatev1.UpdaterRegistrationSpec{Sequence: 3, Claims: []string{"/x"}, AnswerInStatus: true}}
	if err := env.Client.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "exactly one of claims, http and answerInStatus") {
		_ = env.Client.Delete(ctx, bad)
		t.Errorf("a registration with claims and answerInStatus: err = %v, want refused", err)
	}

	pool(t, x, updatev1.UpdateStrategy{})
	setPool := func(mutate func(p *updatev1.NodePool)) string {
		var p updatev1.NodePool
		if err := env.Client.Get(ctx, client.ObjectKey{Name: x}, &p); err != nil {
			t.Fatal(err)
		}
		before := p.DeepCopy()
		mutate(&p)
		if err := env.Client.Patch(ctx, &p, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
		return inplacectl.RequestName(x, inplace.Revision(p.Spec.Template))
	}
	waitRequest := func(name string, phase updatev1.RequestPhase) *updatev1.ExternalUpdateRequest {
		var r updatev1.ExternalUpdateRequest
		testenv.Eventually(t, waitTimeout, "request "+name+" "+string(phase), func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &r); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return r.Status.Phase == phase, nil
		})
		t.Logf("request %s %s", name, phase)
		return &r
	}

	// Revision 1: agent v2 and a file; the first plan holds.
	first := setPool(func(p *updatev1.NodePool) { p.Spec.AutoUpdate = true })
	r := waitRequest(first, updatev1.RequestPlanned)
	if r.Spec.Nodes != 2 || len(r.Spec.Changes) != 2 || r.Status.Plan != first {
		t.Fatalf("request = %+v, want 2 nodes, 2 changes, plan %s", r, first)
	}
	p := waitPlan(t, first, "first plan running", statusIs(updatev1.StatusUpdating))
	if len(p.Spec.Updaters) != 2 || p.Spec.Updaters[0].Name != x+"-files" || p.Spec.Updaters[1].Name != x+"-agent" || p.Spec.Updaters[1].UpdaterUpdateTemplateRef.Name != holding.Name {
		t.Fatalf("plan updaters = %+v, want files then agent (with the hook's template)", p.Spec.Updaters)
	}

	// Revision 2 while it runs: it is aborted, and the new plan runs after it.
	second := setPool(func(p *updatev1.NodePool) { p.Spec.Template.AgentVersion = "v3" })
	waitPlan(t, first, "first plan aborted by the newer change", statusIs(updatev1.StatusAborted))
	waitRequest(second, updatev1.RequestPlanned)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var l fleetv1.FleetNodeList
		_ = env.Client.List(context.Background(), &l, client.MatchingLabels{"pool": x})
		for _, n := range l.Items {
			t.Logf("at failure: node %s labels %v ann %v spec.phase %s status %s conds %+v", n.Name, n.Labels, n.Annotations, n.Spec.UpdatePhase, n.Status.UpdateStatus, n.Status.Conditions)
		}
		var p updatev1.InPlaceUpdatePlan
		_ = env.Client.Get(context.Background(), client.ObjectKey{Name: second}, &p)
		t.Logf("at failure: plan %+v", p.Status)
	})
	waitPlan(t, second, "second plan updated", statusIs(updatev1.StatusUpdated))
	for name, st := range nodeStatuses(t, x) {
		if st != "updated" {
			t.Errorf("node %s is %q after the second plan, want updated", name, st)
		}
	}
	mu.Lock()
	if len(calls) < 2 || calls[0].Pool != x || calls[0].Nodes != 2 {
		t.Errorf("hook calls = %+v, want one per request naming the pool and 2 nodes", calls)
	}
	mu.Unlock()

	// Revision 3: an OS image nobody claims.
	third := setPool(func(p *updatev1.NodePool) { p.Spec.Template.OSImage = "debian-13" })
	r = waitRequest(third, updatev1.RequestFailed)
	c := meta.FindStatusCondition(r.Status.Conditions, "Ready")
	if c == nil || c.Reason != updatev1.ReasonUnclaimed || !strings.Contains(c.Message, inplace.PathOSImage) {
		t.Errorf("request Ready = %+v, want ChangeUnclaimed naming %s", c, inplace.PathOSImage)
	}
}
