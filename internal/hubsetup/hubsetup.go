// Package hubsetup assembles a hub: it builds the hub's features (node jobs,
// tasks), the hub with them, and the MQTT bridge when one is configured, and
// adds them to a controller-runtime manager. It is to a hub what
// internal/manager is to the controllers, and the CLI only maps flags to
// its Options.
//
// Adding a feature is a package implementing hub.Feature and one line in
// Setup.
//
// What it does not do: parse flags, create the manager, or run anything
// (mgr.Start does).
package hubsetup

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/hub/mqttbridge"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobhub"
	"github.com/drover-fleet/drover/internal/serverless/apphub"
	"github.com/drover-fleet/drover/internal/task/taskhub"
)

// Options configure a hub and its features.
type Options struct {
	// Hub configures the hub. Setup fills Client, APIReader and Recorder
	// from the manager and Features from the fields below. Its Clock
	// (default: the wall clock), Logger (default: discard) and Registerer
	// (default: none) serve every part; each part logs with its own
	// component key.
	Hub hub.Options
	// NodeJobs dispatches node jobs (NodeUpgradeJob, ImagePrePullJob) to
	// the agents (off with --feature-gates=disableNodeTaskV1alpha2).
	NodeJobs bool
	// Tasks dispatches tasks (batch.drover.io) and serves `drover logs`.
	Tasks bool
	// Apps routes serverless instances and sessions (serverless.drover.io).
	Apps bool
	// MQTT carries the agent protocol over MQTT too. Default: off.
	MQTT MQTTOptions
}

// MQTTOptions configure the hub's MQTT bridge. With neither Broker nor
// Listen set there is no bridge.
type MQTTOptions struct {
	// Listen is the TLS address of an embedded broker.
	Listen string
	// Broker is an external broker's URL (ssl://host:port), used instead
	// of an embedded one.
	Broker string
	// Prefix is the topic prefix. Default: topics.DefaultPrefix.
	Prefix string
}

// Hub is what Setup added to the manager.
type Hub struct {
	*hub.Hub
	// MQTT is the bridge; nil when MQTT is off.
	MQTT *mqttbridge.Bridge
}

// Setup builds the enabled features, the hub and the MQTT bridge, and adds
// them to mgr. The hub serves once mgr starts.
func Setup(mgr ctrl.Manager, opts Options) (*Hub, error) {
	log := opts.Hub.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	reg := opts.Hub.Registerer
	// One clock for every part: a feature's timing and the hub's agree.
	opts.Hub.Clock = clock.Or(opts.Hub.Clock)
	clk := opts.Hub.Clock
	var features []hub.Feature
	if opts.NodeJobs {
		e := nodejobhub.New(nodejobhub.Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
			Logger: log.With("component", "nodejob"), Registerer: reg, Clock: clk})
		if err := e.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("set up the hub's node jobs: %w", err)
		}
		features = append(features, e)
	}
	if opts.Tasks {
		d := taskhub.New(taskhub.Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
			Logger: log.With("component", "task"), Registerer: reg, Clock: clk})
		// The context only registers the dispatcher's field indexes.
		if err := d.SetupWithManager(context.Background(), mgr); err != nil {
			return nil, fmt.Errorf("set up the hub's tasks: %w", err)
		}
		features = append(features, d)
	}
	if opts.Apps {
		a := apphub.New(apphub.Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
			Logger: log.With("component", "apps"), Registerer: reg, Clock: clk})
		// The context only registers the feature's field indexes.
		if err := a.SetupWithManager(context.Background(), mgr); err != nil {
			return nil, fmt.Errorf("set up the hub's applications: %w", err)
		}
		features = append(features, a)
	}

	ho := opts.Hub
	ho.Client, ho.APIReader = mgr.GetClient(), mgr.GetAPIReader()
	ho.Recorder = mgr.GetEventRecorder("drover-hub")
	ho.Features = features
	ho.Logger = log.With("component", "hub")
	h, err := hub.New(ho)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(h); err != nil {
		return nil, fmt.Errorf("add hub %s to the manager: %w", h.Name(), err)
	}
	out := &Hub{Hub: h}
	if out.MQTT, err = setupMQTT(mgr, h, opts, log); err != nil {
		return nil, err
	}
	return out, nil
}

// setupMQTT adds h's MQTT bridge to mgr, unless MQTT is off. An external
// broker replaces the embedded one.
func setupMQTT(mgr ctrl.Manager, h *hub.Hub, opts Options, log *slog.Logger) (*mqttbridge.Bridge, error) {
	m := opts.MQTT
	o := mqttbridge.Options{Hub: h, Prefix: m.Prefix, ServingHosts: opts.Hub.ServingHosts,
		Logger: log.With("component", "mqtt"), Registerer: opts.Hub.Registerer}
	switch {
	case m.Broker != "":
		o.Broker = m.Broker
	case m.Listen != "":
		o.Listen = m.Listen
	default:
		return nil, nil
	}
	b, err := mqttbridge.New(o)
	if err != nil {
		return nil, fmt.Errorf("set up the hub's MQTT bridge: %w", err)
	}
	if err := mgr.Add(b); err != nil {
		return nil, fmt.Errorf("add the MQTT bridge to the manager: %w", err)
	}
	return b, nil
}
