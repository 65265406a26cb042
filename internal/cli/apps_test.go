package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
)

func TestPrintInstances(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	since := metav1.NewTime(now.Add(-30 * time.Second))
	slices := []serverlessv1.InstanceSlice{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: "echo-edge-1"},
		Spec: serverlessv1.InstanceSliceSpec{Application: "echo", NodeName: "edge-1", Instances: []serverlessv1.SliceInstance{
			{Name: "echo-b", UID: "u2", Created: metav1.NewTime(now.Add(-time.Minute))},
			{Name: "echo-a", UID: "u1", Standby: true, Created: metav1.NewTime(now.Add(-2 * time.Minute))},
		}},
		Status: serverlessv1.InstanceSliceStatus{Address: "10.0.0.7", Instances: []serverlessv1.InstanceStatus{
			{Name: "echo-a", State: serverlessv1.InstanceStandby, Port: 30001, Since: &since},
			{Name: "echo-old", State: serverlessv1.InstanceTerminating, Port: 30000, Sessions: []string{"s1"}, Reason: "Deleted"},
		}},
	}}
	var out bytes.Buffer
	printInstances(&out, instanceLines(slices), false, true, now)
	want := "NAME       APPLICATION   STATE         NODE     PORT     SESSIONS   AGE         STANDBY   SINCE    REASON\n" +
		"echo-a     echo          Standby       edge-1   30001    0          2m          true      30s      <none>\n" +
		"echo-b     echo          Pending       edge-1   <none>   0          60s         false     <none>   <none>\n" +
		"echo-old   echo          Terminating   edge-1   30000    1          <unknown>   false     <none>   Deleted\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestPrintSessions(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	del := metav1.NewTime(now)
	ss := []serverlessv1.ApplicationSession{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: "echo-x", CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			Spec:   serverlessv1.ApplicationSessionSpec{Application: "echo", InstanceName: "echo-a", NodeName: "edge-1"},
			Status: serverlessv1.ApplicationSessionStatus{Phase: serverlessv1.SessionLive, Endpoint: &serverlessv1.Endpoint{Host: "10.0.0.7", Port: 30001}, Clients: []string{"alice"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: "echo-a", CreationTimestamp: metav1.NewTime(now.Add(-time.Minute)), DeletionTimestamp: &del},
			Spec:   serverlessv1.ApplicationSessionSpec{Application: "echo"},
			Status: serverlessv1.ApplicationSessionStatus{}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "games", Name: "echo-b", CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			Spec:   serverlessv1.ApplicationSessionSpec{Application: "echo"},
			Status: serverlessv1.ApplicationSessionStatus{Phase: serverlessv1.SessionTerminated, Reason: serverlessv1.ReasonNoCapacity}},
	}
	var out bytes.Buffer
	printSessions(&out, ss, false, true, now)
	want := "NAME     APPLICATION   PHASE               NODE     ENDPOINT         REASON       AGE   INSTANCE   CLIENTS   FLAGGED\n" +
		"echo-a   echo          Pending (closing)   <none>   <none>           <none>       60s   <none>     <none>    false\n" +
		"echo-b   echo          Terminated          <none>   <none>           NoCapacity   60s   <none>     <none>    false\n" +
		"echo-x   echo          Live                edge-1   10.0.0.7:30001   <none>       60s   echo-a     alice     false\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestParseData(t *testing.T) {
	got, err := parseData([]string{"user=alice", "expr=a=b", "empty="})
	if err != nil {
		t.Fatal(err)
	}
	if got["user"] != "alice" || got["expr"] != "a=b" || got["empty"] != "" || len(got) != 3 {
		t.Errorf("parseData = %v", got)
	}
	for _, bad := range []string{"novalue", "=x"} {
		if _, err := parseData([]string{bad}); err == nil || !strings.Contains(err.Error(), "KEY=VALUE") {
			t.Errorf("parseData(%q) = %v, want a KEY=VALUE error", bad, err)
		}
	}
}
