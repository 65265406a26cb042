package v1alpha1_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := serverlessv1.AddToScheme(s); err != nil {
		panic(err)
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: s})
	code := m.Run()
	stop()
	os.Exit(code)
}

func app(name string, mutate func(*serverlessv1.Application)) *serverlessv1.Application {
	a := &serverlessv1.Application{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       serverlessv1.ApplicationSpec{Command: []string{"/usr/bin/sim", "--level; rm -rf /"}},
	}
	if mutate != nil {
		mutate(a)
	}
	return a
}

func TestApplicationValidation(t *testing.T) {
	ctx := context.Background()
	c := env.Client
	tests := []struct {
		name    string
		app     *serverlessv1.Application
		wantErr string
	}{
		{"argv with shell characters is just data", app("ok-argv", nil), ""},
		{"probes and a port", app("ok-probes", func(a *serverlessv1.Application) {
			a.Spec.Ports = []serverlessv1.Port{{Name: "game"}}
			a.Spec.LivenessProbe = &serverlessv1.Probe{TCP: true}
			a.Spec.ReadinessProbe = &serverlessv1.Probe{HTTPGet: &serverlessv1.HTTPGetProbe{Path: "/healthz"}}
		}), ""},
		{"no command", app("bad-cmd", func(a *serverlessv1.Application) { a.Spec.Command = nil }), "command is required"},
		{"empty argv[0]", app("bad-argv0", func(a *serverlessv1.Application) { a.Spec.Command = []string{"", "x"} }), "command[0] must name a program"},
		{"NUL in argv", app("bad-nul", func(a *serverlessv1.Application) { a.Spec.Command = []string{"/bin/x", "a\x00b"} }), "command"},
		{"container without image", app("bad-image", func(a *serverlessv1.Application) { a.Spec.Runtime = serverlessv1.RuntimeContainer }), "image is required"},
		{"image on process runtime", app("bad-image2", func(a *serverlessv1.Application) { a.Spec.Image = "busybox:1" }), "image is required with runtime container, and only with it"},
		{"bad image", app("bad-image3", func(a *serverlessv1.Application) {
			a.Spec.Runtime, a.Spec.Image = serverlessv1.RuntimeContainer, "busy box;ls"
		}), "spec.image"},
		{"probe with two checks", app("bad-probe", func(a *serverlessv1.Application) {
			a.Spec.LivenessProbe = &serverlessv1.Probe{TCP: true, Exec: []string{"/bin/true"}}
		}), "exactly one of exec, tcp and httpGet"},
		{"probe with none", app("bad-probe2", func(a *serverlessv1.Application) { a.Spec.LivenessProbe = &serverlessv1.Probe{} }), "exactly one of exec, tcp and httpGet"},
		{"http probe path", app("bad-probe3", func(a *serverlessv1.Application) {
			a.Spec.ReadinessProbe = &serverlessv1.Probe{HTTPGet: &serverlessv1.HTTPGetProbe{Path: "healthz"}}
		}), "path"},
		{"two ports", app("bad-ports", func(a *serverlessv1.Application) {
			a.Spec.Ports = []serverlessv1.Port{{Name: "a"}, {Name: "b"}}
		}), "ports"},
		{"bad port name", app("bad-port", func(a *serverlessv1.Application) { a.Spec.Ports = []serverlessv1.Port{{Name: "Game_Port"}} }), "name"},
		{"min above max", app("bad-scale", func(a *serverlessv1.Application) {
			a.Spec.Scaling = serverlessv1.Scaling{MinInstances: 5, MaxInstances: 2, StandbyInstances: ptr.To[int32](1), Burst: 2, SessionsPerInstance: 1,
				IdleInstanceTimeout: metav1.Duration{Duration: time.Minute}}
		}), "minInstances must not be above maxInstances"},
		{"daemon without instances", app("bad-daemon", func(a *serverlessv1.Application) { a.Spec.Mode = serverlessv1.ModeDaemon }), "daemon application needs scaling.minInstances"},
		{"open timeout too long", app("bad-timeout", func(a *serverlessv1.Application) {
			a.Spec.Session = serverlessv1.SessionPolicy{OpenTimeout: metav1.Duration{Duration: 2 * time.Hour}}
		}), "openTimeout must be a duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Create(ctx, tt.app)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("created; want an error with %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q lacks %q", err, tt.wantErr)
			}
		})
	}
}

func TestApplicationDefaults(t *testing.T) {
	ctx := context.Background()
	a := app("defaults", nil)
	if err := env.Client.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	var got serverlessv1.Application
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(a), &got); err != nil {
		t.Fatal(err)
	}
	s := got.Spec
	want := serverlessv1.Scaling{MinInstances: 0, MaxInstances: 10, StandbyInstances: ptr.To[int32](1), Burst: 2, SessionsPerInstance: 1,
		IdleInstanceTimeout: metav1.Duration{Duration: 5 * time.Minute}}
	if s.Scaling.Standby() != 1 || s.Scaling.StandbyInstances == nil {
		t.Errorf("standbyInstances %v, want defaulted to 1", s.Scaling.StandbyInstances)
	}
	s.Scaling.StandbyInstances, want.StandbyInstances = nil, nil
	if s.Scaling != want {
		t.Errorf("scaling defaults %+v, want %+v", s.Scaling, want)
	}
	p := s.Session
	if p.OpenTimeout.Duration != 10*time.Second || p.HeartbeatInterval.Duration != 5*time.Second || p.HeartbeatMisses != 3 ||
		p.EvacuationTimeout.Duration != 30*time.Second || p.OnHeartbeatLost != "Close" {
		t.Errorf("session defaults %+v", p)
	}
	if s.Mode != serverlessv1.ModeSessions || s.Runtime != serverlessv1.RuntimeProcess {
		t.Errorf("mode %q runtime %q, want sessions and process", s.Mode, s.Runtime)
	}
}

func TestSessionBindingIsSetOnce(t *testing.T) {
	ctx := context.Background()
	c := env.Client
	s := &serverlessv1.ApplicationSession{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: "default"},
		Spec: serverlessv1.ApplicationSessionSpec{Application: "echo", Data: map[string]string{"user": "alice"}}}
	if err := c.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	s.Spec.InstanceName = "echo-abcde"
	if err := c.Update(ctx, s); err == nil || !strings.Contains(err.Error(), "set together") {
		t.Fatalf("instanceName without nodeName: got %v, want an error", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	s.Spec.InstanceName, s.Spec.NodeName = "echo-abcde", "edge-1"
	if err := c.Update(ctx, s); err != nil {
		t.Fatalf("bind: %v", err)
	}
	s.Spec.NodeName = "edge-2"
	if err := c.Update(ctx, s); err == nil || !strings.Contains(err.Error(), "cannot be changed once set") {
		t.Fatalf("rebind: got %v, want an error", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	s.Spec.Application = "other"
	if err := c.Update(ctx, s); err == nil || !strings.Contains(err.Error(), "application cannot be changed") {
		t.Fatalf("change application: got %v, want an error", err)
	}
}
