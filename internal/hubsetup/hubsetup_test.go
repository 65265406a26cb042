package hubsetup_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/hubsetup"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: manager.Scheme()})
	testkit.VerifyNoLeaksAfter(m, stop)
}

// TestSetupServes: a hub set up with every feature and an embedded MQTT
// broker listens on both once its manager runs, and stops with it.
func TestSetupServes(t *testing.T) {
	e := testenv.Require(t, env)
	skip := true
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: manager.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := hubsetup.Setup(mgr, hubsetup.Options{
		Hub: hub.Options{Name: "hubsetup", Namespace: "hubsetup", ListenAddress: "127.0.0.1:0",
			ServingHosts: []string{"127.0.0.1"}, Registerer: prometheus.NewRegistry()},
		NodeJobs: true,
		Tasks:    true,
		Apps:     true,
		MQTT:     hubsetup.MQTTOptions{Listen: "127.0.0.1:0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if h.MQTT == nil {
		t.Fatal("no MQTT bridge with MQTT.Listen set")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(testkit.DefaultTimeout):
			t.Errorf("manager still running %v after stop", testkit.DefaultTimeout)
		}
	}()
	wctx, wcancel := context.WithTimeout(ctx, testkit.DefaultTimeout)
	defer wcancel()
	if _, err := h.Addr(wctx); err != nil {
		t.Fatalf("hub did not listen: %v", err)
	}
	if _, err := h.MQTT.BrokerURL(wctx); err != nil {
		t.Fatalf("MQTT bridge did not connect: %v", err)
	}
}

// TestSetupWithoutMQTT: with neither a broker nor a listen address there is
// no bridge.
func TestSetupWithoutMQTT(t *testing.T) {
	e := testenv.Require(t, env)
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: manager.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := hubsetup.Setup(mgr, hubsetup.Options{Hub: hub.Options{Name: "hubsetup-plain"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.Hub == nil || h.MQTT != nil {
		t.Errorf("Setup = hub %v, bridge %v; want a hub and no bridge", h.Hub, h.MQTT)
	}
}
