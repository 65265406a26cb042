package nodejob

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func entry(name string, p opsv1.NodeTaskPhase, action string, at time.Time) opsv1.NodeTaskStatus {
	e := opsv1.NodeTaskStatus{NodeName: name, Phase: p, Action: action}
	if !at.IsZero() {
		mt := metav1.NewMicroTime(at)
		e.UpdateTime = &mt
	}
	return e
}

func online(names ...string) map[string]NodeState {
	m := map[string]NodeState{}
	for _, n := range names {
		m[n] = NodeState{Exists: true, Phase: "Online", Hub: "hub-a"}
	}
	return m
}

// outcome renders the changes as "node:Phase" in order, for compact tables.
func outcome(r Result) string {
	var s []string
	for _, c := range r.Changes {
		s = append(s, c.To.NodeName+":"+string(c.To.Phase))
	}
	return strings.Join(s, " ")
}

func TestStep(t *testing.T) {
	in := Inputs{Concurrency: 2, Timeout: time.Minute}
	tests := []struct {
		name    string
		in      Inputs
		entries []opsv1.NodeTaskStatus
		nodes   map[string]NodeState
		want    string
		recheck time.Duration
	}{
		{"admits up to concurrency, by name", in,
			[]opsv1.NodeTaskStatus{entry("c", "Pending", "", time.Time{}), entry("a", "Pending", "", time.Time{}), entry("b", "Pending", "", time.Time{})},
			online("a", "b", "c"), "a:InProgress b:InProgress", time.Minute + time.Millisecond},
		{"running nodes hold their slots", in,
			[]opsv1.NodeTaskStatus{entry("a", "InProgress", nodejobwire.Upgrade, t0.Add(-10*time.Second)), entry("b", "Pending", "", time.Time{}), entry("c", "Pending", "", time.Time{})},
			online("a", "b", "c"), "b:InProgress", 50*time.Second + time.Millisecond},
		{"a rollback keeps its slot", in,
			[]opsv1.NodeTaskStatus{entry("a", "InProgress", nodejobwire.RollBack, t0), entry("b", "InProgress", nodejobwire.Check, t0), entry("c", "Pending", "", time.Time{})},
			online("a", "b", "c"), "", time.Minute + time.Millisecond},
		{"finished nodes free their slots", in,
			[]opsv1.NodeTaskStatus{entry("a", "Successful", nodejobwire.Upgrade, t0), entry("b", "Failure", nodejobwire.RollBack, t0), entry("c", "Pending", "", time.Time{})},
			online("a", "b", "c"), "c:InProgress", time.Minute + time.Millisecond},
		{"offline, missing, revoked and unapproved nodes fail at once without a slot", Inputs{Concurrency: 1, Timeout: time.Minute},
			[]opsv1.NodeTaskStatus{entry("a", "Pending", "", time.Time{}), entry("b", "Pending", "", time.Time{}), entry("c", "Pending", "", time.Time{}), entry("d", "Pending", "", time.Time{}), entry("e", "Pending", "", time.Time{})},
			map[string]NodeState{"a": {Exists: true, Phase: "Offline"}, "c": {Exists: true, Phase: "Revoked"}, "d": {Exists: true, Phase: "Pending"}, "e": {Exists: true, Phase: "Online", Hub: "h"}},
			"a:Failure b:Failure c:Failure d:Failure e:InProgress", time.Minute + time.Millisecond},
		{"a silent node goes Unknown and frees its slot", in,
			[]opsv1.NodeTaskStatus{entry("a", "InProgress", nodejobwire.Upgrade, t0.Add(-time.Minute-time.Microsecond)), entry("b", "InProgress", "", t0.Add(-61*time.Second)), entry("c", "Pending", "", time.Time{})},
			online("a", "b", "c"), "a:Unknown b:Unknown c:InProgress", time.Minute + time.Millisecond},
		{"exactly timeoutSeconds since the last update is not late yet", in,
			[]opsv1.NodeTaskStatus{entry("a", "InProgress", nodejobwire.Upgrade, t0.Add(-time.Minute)), entry("b", "Pending", "", time.Time{})},
			online("a", "b"), "b:InProgress", time.Millisecond},
		{"waiting at Confirm never times out", Inputs{Concurrency: 1, Timeout: time.Minute},
			[]opsv1.NodeTaskStatus{confirming(metav1.ConditionUnknown), entry("b", "Pending", "", time.Time{})},
			online("a", "b"), "", 0},
		{"a Confirm that ended times out like any action", Inputs{Concurrency: 1, Timeout: time.Minute},
			[]opsv1.NodeTaskStatus{confirming(metav1.ConditionTrue), entry("b", "Pending", "", time.Time{})},
			online("a", "b"), "a:Unknown b:InProgress", time.Minute + time.Millisecond},
		{"waiting for confirmation never times out but holds its slot", Inputs{Concurrency: 1, Timeout: time.Minute},
			[]opsv1.NodeTaskStatus{entry("a", "InProgress", nodejobwire.WaitingConfirmation, t0.Add(-time.Hour)), entry("b", "Pending", "", time.Time{})},
			online("a", "b"), "", 0},
		{"abort fails the nodes not started, leaves running ones", Inputs{Concurrency: 5, Timeout: time.Minute, Aborted: true},
			[]opsv1.NodeTaskStatus{entry("a", "InProgress", nodejobwire.Upgrade, t0), entry("b", "Pending", "", time.Time{})},
			online("a", "b"), "b:Failure", time.Minute + time.Millisecond},
		{"nothing to do", in,
			[]opsv1.NodeTaskStatus{entry("a", "Successful", "", t0)},
			online("a"), "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Step(t0, tt.in, tt.entries, tt.nodes)
			if got := outcome(r); got != tt.want {
				t.Errorf("changes = %q, want %q", got, tt.want)
			}
			if r.RecheckAfter != tt.recheck {
				t.Errorf("RecheckAfter = %v, want %v", r.RecheckAfter, tt.recheck)
			}
			for _, c := range r.Changes {
				if c.To.Phase.Final() && c.To.Reason == "" {
					t.Errorf("%s ended %s without a reason", c.To.NodeName, c.To.Phase)
				}
				if c.To.UpdateTime == nil || !c.To.UpdateTime.Time.Equal(t0) {
					t.Errorf("%s: updateTime = %v, want now", c.To.NodeName, c.To.UpdateTime)
				}
			}
		})
	}
}

// confirming is node a at Confirm, an hour ago, in status st.
func confirming(st metav1.ConditionStatus) opsv1.NodeTaskStatus {
	e := entry("a", "InProgress", nodejobwire.Confirm, t0.Add(-time.Hour))
	e.ActionFlow = []opsv1.ActionStatus{{Action: nodejobwire.Check, Status: metav1.ConditionTrue}, {Action: nodejobwire.Confirm, Status: st}}
	return e
}

// TestTimeoutCountsFromTheReportNotItsSecond: a report received at
// 12:00:00.700 with timeoutSeconds 1 is late only after 12:00:01.700,
// whatever second it fell in (fake clock: the times are given).
func TestTimeoutCountsFromTheReportNotItsSecond(t *testing.T) {
	received := t0.Add(700 * time.Millisecond)
	e := opsv1.NodeTaskStatus{NodeName: "a", Phase: opsv1.NodeTaskPhaseInProgress}
	ApplyReport(&e, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: received}, received, false)
	if e.UpdateTime == nil || !e.UpdateTime.Time.Equal(received) {
		t.Fatalf("updateTime = %v, want the receipt %v", e.UpdateTime, received)
	}
	in := Inputs{Concurrency: 1, Timeout: time.Second}
	for _, tc := range []struct {
		now  time.Time
		want string
	}{
		{t0.Add(1500 * time.Millisecond), ""},
		{received.Add(time.Second), ""}, // exactly timeoutSeconds: not late
		{received.Add(time.Second + time.Microsecond), "a:Unknown"},
	} {
		r := Step(tc.now, in, []opsv1.NodeTaskStatus{e}, nil)
		if got := outcome(r); got != tc.want {
			t.Errorf("at %v: changes = %q, want %q", tc.now.Sub(received), got, tc.want)
		}
		if tc.want == "" && (r.RecheckAfter <= 0 || !tc.now.Add(r.RecheckAfter).After(received.Add(time.Second))) {
			t.Errorf("at %v: RecheckAfter %v does not land past the deadline", tc.now.Sub(received), r.RecheckAfter)
		}
	}
}

func TestChangeApplyIsCompareAndSet(t *testing.T) {
	r := Step(t0, Inputs{Concurrency: 1, Timeout: time.Minute}, []opsv1.NodeTaskStatus{entry("a", "InProgress", nodejobwire.Upgrade, t0.Add(-2*time.Minute))}, online("a"))
	if len(r.Changes) != 1 {
		t.Fatalf("changes = %v", r.Changes)
	}
	// A hub reported meanwhile: the timeout must not overwrite the report.
	fresh := entry("a", "InProgress", nodejobwire.RollBack, t0)
	if r.Changes[0].Apply(&fresh) || fresh.Phase != opsv1.NodeTaskPhaseInProgress {
		t.Errorf("Apply overwrote a newer report: %+v", fresh)
	}
	same := entry("a", "InProgress", nodejobwire.Upgrade, t0.Add(-2*time.Minute))
	if !r.Changes[0].Apply(&same) || same.Phase != opsv1.NodeTaskPhaseUnknown {
		t.Errorf("Apply on the entry it saw: %+v", same)
	}
}

func TestFailuresOldestFirstAndBounded(t *testing.T) {
	var es []opsv1.NodeTaskStatus
	for i := range 30 {
		es = append(es, entry(string(rune('a'+i%26))+string(rune('a'+i/26)), "Failure", "", t0.Add(time.Duration(30-i)*time.Second)))
	}
	es = append(es, entry("ok", "Successful", "", t0))
	f := Failures(es, opsv1.MaxFailuresOnJob)
	if len(f) != opsv1.MaxFailuresOnJob {
		t.Fatalf("len = %d", len(f))
	}
	if f[0].NodeName != es[29].NodeName {
		t.Errorf("first failure = %s, want the oldest %s", f[0].NodeName, es[29].NodeName)
	}
}
