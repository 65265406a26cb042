package apphub

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
)

func TestTerminatedReason(t *testing.T) {
	for _, tc := range []struct {
		name           string
		status, report string
		heartbeat      bool
		want           string
	}{
		{"the report's reason", "Terminated", serverlessv1.ReasonOpenTimeout, false, serverlessv1.ReasonOpenTimeout},
		{"the status's when it is not the state", "InstanceCrashed", "", false, "InstanceCrashed"},
		{"the state's name is no reason", "Terminated", "", false, serverlessv1.ReasonClosed},
		{"cancelled is closed", "", "Cancelled", false, serverlessv1.ReasonClosed},
		{"closed after the heartbeat policy", "Terminated", serverlessv1.ReasonClosed, true, serverlessv1.ReasonHeartbeatLost},
		{"the instance's own reason wins over the policy", "Terminated", serverlessv1.ReasonInstanceCrashed, true, serverlessv1.ReasonInstanceCrashed},
	} {
		if got := terminatedReason(tc.status, tc.report, tc.heartbeat); got != tc.want {
			t.Errorf("%s: terminatedReason(%q, %q, %v) = %q, want %q", tc.name, tc.status, tc.report, tc.heartbeat, got, tc.want)
		}
	}
}

func TestVisible(t *testing.T) {
	want := map[serverlessv1.SessionPhase]bool{
		serverlessv1.SessionPending: false, serverlessv1.SessionStarting: false, serverlessv1.SessionReadinessChecking: false,
		serverlessv1.SessionReady: true, serverlessv1.SessionLive: true, serverlessv1.SessionEvacuating: true,
		serverlessv1.SessionTerminating: false, serverlessv1.SessionTerminated: true,
	}
	for p, w := range want {
		if visible(p) != w {
			t.Errorf("visible(%s) = %v, want %v", p, !w, w)
		}
	}
}

// TestItems: the items' specs pass the agent's validation, for the
// container runtime and a daemon too, and a session without its
// Application gets the agent's defaults.
func TestItems(t *testing.T) {
	app := &serverlessv1.Application{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "d"},
		Spec: serverlessv1.ApplicationSpec{Mode: serverlessv1.ModeDaemon, Runtime: serverlessv1.RuntimeContainer, Image: "registry.example/d:1"}}
	it, err := InstanceItem(app, serverlessv1.SliceInstance{Name: "d-1", UID: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := appwire.DecodeInstance(it.Spec)
	if err != nil || !s.Daemon || s.Runtime != "container" || s.Image != "registry.example/d:1" || it.Uid != appwire.InstanceWorkID("u1") {
		t.Errorf("daemon container instance: %+v, %v (uid %s)", s, err, it.Uid)
	}
	app.Spec.Runtime, app.Spec.Image, app.Spec.Command = serverlessv1.RuntimeProcess, "stale", []string{"/bin/true"}
	it, err = InstanceItem(app, serverlessv1.SliceInstance{Name: "d-2", UID: "u2"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := appwire.DecodeInstance(it.Spec); err != nil || s.Image != "" {
		t.Errorf("process instance: %+v, %v; want no image", s, err)
	}
	sess := &serverlessv1.ApplicationSession{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "su"},
		Spec: serverlessv1.ApplicationSessionSpec{Application: "gone"}}
	it, err = SessionItem(nil, sess, "u2")
	if err != nil {
		t.Fatal(err)
	}
	if ss, err := appwire.DecodeSession(it.Spec); err != nil || ss.OpenTimeoutMillis != 0 || ss.Instance != appwire.InstanceWorkID("u2") || it.Uid != appwire.SessionWorkID("su") {
		t.Errorf("session of a missing application: %+v, %v", ss, err)
	}
	if _, err := InstanceItem(&serverlessv1.Application{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "bad"}},
		serverlessv1.SliceInstance{Name: "b-1", UID: "u3"}); err == nil {
		t.Error("an instance without a command was built")
	}
}
