package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/hubsetup"
	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
)

// mqttOptions are the hub's MQTT flags.
type mqttOptions struct {
	listen string
	broker string
	prefix string
}

func (m *mqttOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&m.listen, "mqtt-listen", "127.0.0.1:8883", "TLS address of the embedded MQTT broker agents may use instead of gRPC; empty disables it")
	fs.StringVar(&m.broker, "mqtt-broker", "", "external MQTT broker ssl://host:port to bridge instead of embedding one (see: drover mqtt mosquitto-config)")
	fs.StringVar(&m.prefix, "mqtt-prefix", topics.DefaultPrefix, "MQTT topic prefix")
}

func (m *mqttOptions) validate() error {
	if m.broker != "" {
		if _, _, err := topics.BrokerURL(m.broker); err != nil {
			return fmt.Errorf("--mqtt-broker: %w", err)
		}
	}
	if _, err := topics.New(m.prefix); err != nil {
		return fmt.Errorf("--mqtt-prefix: %w", err)
	}
	return nil
}

// options are the hub's MQTT options for hubsetup.
func (m *mqttOptions) options() hubsetup.MQTTOptions {
	return hubsetup.MQTTOptions{Listen: m.listen, Broker: m.broker, Prefix: m.prefix}
}

// mqttURL waits for the MQTT bridge to connect and returns its broker's URL;
// "" when MQTT is off.
func (r *running) mqttURL(ctx context.Context) (string, error) {
	if r.mqtt == nil {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	u, err := r.mqtt.BrokerURL(ctx)
	if err != nil {
		return "", fmt.Errorf("mqtt bridge did not connect to its broker: %w", err)
	}
	return u, nil
}

func newMQTTCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "mqtt", Short: "Helpers for carrying the agent protocol over an external MQTT broker"}
	var (
		ns, dir, listen, user string
		hosts, prefixes       []string
		validity              time.Duration
	)
	conf := &cobra.Command{
		Use:   "mosquitto-config",
		Short: "Write a Mosquitto configuration that enforces Drover's MQTT rules",
		Long: `Write mosquitto.conf, an ACL file, a serving certificate signed by
Drover's CA and the CRL of revoked node certificates into --dir. The broker then admits only clients with a
certificate from Drover's CA, takes the certificate's common name as the
user and as the client id (so that no client can disconnect another by
taking its id), and lets each node publish and subscribe only under its
own topics; the hub of each prefix (common name drover:hub:PREFIX) may use
every topic under it, so hubs sharing the broker need one prefix each.
Run it with
  mosquitto -c DIR/mosquitto.conf
and start hubs with --mqtt-broker ssl://HOST:PORT. Keep the CRL current
with drover mqtt crl --dir DIR --watch --pidfile MOSQUITTO_PID_FILE: the
broker knows nothing of revocations but what the CRL lists.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var layouts []topics.Layout
			for _, p := range prefixes {
				l, err := topics.New(p)
				if err != nil {
					return fmt.Errorf("--prefix: %w", err)
				}
				layouts = append(layouts, l)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ca, err := hub.EnsureCA(cmd.Context(), c, ns, time.Now())
			if err != nil {
				return fmt.Errorf("read Drover's CA: %w", err)
			}
			list, err := revokedList(cmd.Context(), c, ns)
			if err != nil {
				return err
			}
			crl, err := hub.CRL([]*pki.CA{ca}, list, time.Now())
			if err != nil {
				return err
			}
			path, err := broker.WriteMosquitto(ca, broker.MosquittoConfig{Dir: dir, Listen: listen, Hosts: hosts, Layouts: layouts, User: user, Validity: validity, CRL: crl})
			if err != nil {
				return err
			}
			cmd.Printf("Wrote %s. Run: mosquitto -c %s\n", path, path)
			cmd.Printf("Keep its CRL current: drover mqtt crl --dir %s --watch --pidfile MOSQUITTO_PID_FILE\n", dir)
			return nil
		},
	}
	conf.Flags().StringVar(&ns, "namespace", "drover-system", "Drover's namespace (holds the CA and the revocation list)")
	conf.Flags().StringVar(&dir, "dir", "", "directory for the files (required)")
	conf.Flags().StringVar(&listen, "listen", "0.0.0.0:8883", "the broker's TLS listener, host:port")
	conf.Flags().StringSliceVar(&hosts, "hosts", nil, "names and IPs in the broker's certificate: what agents and hubs dial (default: the listen host, or 127.0.0.1 and localhost)")
	conf.Flags().StringSliceVar(&prefixes, "prefix", []string{topics.DefaultPrefix}, "MQTT topic prefixes (the hubs' and agents' --mqtt-prefix), one per hub sharing the broker")
	conf.Flags().StringVar(&user, "user", "", "system user Mosquitto runs as when started as root (its user option); it must read --dir")
	conf.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "validity of the broker's certificate")
	_ = conf.MarkFlagRequired("dir")
	cmd.AddCommand(conf, newMQTTCRLCommand(g))
	return cmd
}
