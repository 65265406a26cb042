package statemetrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/statemetrics"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestCollector writes objects to a real API server and reads the gauges
// the collector makes of them.
func TestCollector(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Scheme: manager.Scheme()})
	ctx := context.Background()
	c := env.Client
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	ns := "drover-state"
	for _, o := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "work"}}} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []struct {
		name, hub string
		phase     fleetv1.FleetNodePhase
	}{{"n1", "hub-a", fleetv1.FleetNodeOnline}, {"n2", "hub-a", fleetv1.FleetNodeOffline}, {"n3", "hub-b", fleetv1.FleetNodeOnline}, {"n4", "", ""}} {
		node := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		if err := c.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		node.Status.Hub, node.Status.Phase = n.hub, n.phase
		if err := c.Status().Update(ctx, node); err != nil {
			t.Fatalf("status of FleetNode %s: %v", n.name, err)
		}
	}
	for hub, renewed := range map[string]time.Time{"hub-a": now.Add(-5 * time.Second), "hub-b": now.Add(-time.Hour)} {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "drover-hub-" + hub},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(hub), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: renewed}}}
		if err := c.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: "work", Name: "broken"},
		Spec: batchv1.FleetJobSpec{TaskGroups: []batchv1.TaskGroupTemplate{{Name: "g", Count: 1,
			Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"false"}}}}}}}
	if err := c.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	job.Status.Phase = batchv1.GroupFailed
	meta.SetStatusCondition(&job.Status.Conditions, metav1.Condition{Type: batchv1.ConditionFailed, Status: metav1.ConditionTrue, Reason: "DeadlineExceeded", Message: "test"})
	if err := c.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}

	elected := make(chan struct{})
	col := statemetrics.New(statemetrics.Options{Reader: c, Namespace: ns, Elected: elected, NodeJobs: true, Tasks: true, Clock: clocktest.New(now)})
	if n := testutil.CollectAndCount(col); n != 0 {
		t.Errorf("before election: %d series, want none (only the leader exports)", n)
	}
	close(elected)
	want := `
# HELP drover_fleet_nodes FleetNodes by the hub in their status (empty before a hub took them) and phase.
# TYPE drover_fleet_nodes gauge
drover_fleet_nodes{hub="",phase="Offline"} 0
drover_fleet_nodes{hub="",phase="Online"} 0
drover_fleet_nodes{hub="",phase="Pending"} 0
drover_fleet_nodes{hub="",phase="Revoked"} 0
drover_fleet_nodes{hub="",phase="Unset"} 1
drover_fleet_nodes{hub="hub-a",phase="Offline"} 1
drover_fleet_nodes{hub="hub-a",phase="Online"} 1
drover_fleet_nodes{hub="hub-b",phase="Online"} 1
# HELP drover_hub_lease_expired 1 when a hub's Lease was not renewed within its duration (the hub is down or cut off from the API), else 0.
# TYPE drover_hub_lease_expired gauge
drover_hub_lease_expired{hub="hub-a"} 0
drover_hub_lease_expired{hub="hub-b"} 1
# HELP drover_job_failed 1 for each FleetJob and node job that failed and still exists (one series per failed job).
# TYPE drover_job_failed gauge
drover_job_failed{kind="FleetJob",name="broken",namespace="work",reason="DeadlineExceeded"} 1
# HELP drover_fleet_jobs FleetJobs by phase.
# TYPE drover_fleet_jobs gauge
drover_fleet_jobs{phase="Completed"} 0
drover_fleet_jobs{phase="Failed"} 1
drover_fleet_jobs{phase="Pending"} 0
drover_fleet_jobs{phase="Running"} 0
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), statemetrics.FleetNodes, statemetrics.HubLeaseExpired, statemetrics.JobFailed, statemetrics.FleetJobs); err != nil {
		t.Error(err)
	}
	// Node job and task series exist at zero with no such objects.
	for _, name := range []string{statemetrics.NodeJobs, statemetrics.NodeJobNodes, statemetrics.Tasks} {
		if n := testutil.CollectAndCount(col, name); n == 0 {
			t.Errorf("no %s series without objects; want every known label value at zero", name)
		}
	}
}
