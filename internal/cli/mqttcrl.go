package cli

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/pki"
)

// crlResync is how often `drover mqtt crl --watch` checks the CRL besides
// on each change of the revocation list: entries expire, the CA Secret may
// change, and the CRL must be signed again before it expires.
const crlResync = time.Minute

// crlRetry is how long the watch waits after the API failed it.
const crlRetry = 10 * time.Second

func newMQTTCRLCommand(g *globalOptions) *cobra.Command {
	var (
		k        crlKeeper
		watching bool
	)
	cmd := &cobra.Command{
		Use:   "crl",
		Short: "Write the CRL of revoked node certificates for a Mosquitto configured by mosquitto-config",
		Long: `Write DIR/crl.pem: one CRL, signed by Drover's CA, for each CA the broker
trusts (DIR/ca.crt), listing the certificates of the nodes whose keys are
on the revocation list (drover revoke). It needs the credentials
mosquitto-config needs: it reads Drover's CA key.

Mosquitto reads crl.pem at start and on SIGHUP. With --pidfile (Mosquitto's
pid_file, e.g. /run/mosquitto/mosquitto.pid) the command sends it SIGHUP
after each write; otherwise restart Mosquitto or send it SIGHUP yourself.
Connections already open are not closed by either: restart Mosquitto to
end them.

With --watch it keeps running and writes the CRL again whenever the
revocation list changes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !watching {
				c, err := g.client()
				if err != nil {
					return err
				}
				k.c = c
				res, err := k.sync(cmd.Context(), time.Now())
				if err != nil {
					return err
				}
				cmd.Println(res.String(k.dir, k.pidfile))
				return nil
			}
			cfg, err := g.restConfig()
			if err != nil {
				return err
			}
			wc, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme()})
			if err != nil {
				return fmt.Errorf("connect to the API: %w", err)
			}
			log, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			k.c = wc
			return k.watch(cmd.Context(), wc, log)
		},
	}
	cmd.Flags().StringVar(&k.ns, "namespace", "drover-system", "Drover's namespace (holds the CA and the revocation list)")
	cmd.Flags().StringVar(&k.dir, "dir", "", "the directory mosquitto-config wrote (required)")
	cmd.Flags().StringVar(&k.pidfile, "pidfile", "", "Mosquitto's PID file: send that process SIGHUP after each write, so that it reads the new CRL")
	cmd.Flags().BoolVar(&watching, "watch", false, "keep running, and write the CRL again whenever the revocation list changes")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

// crlKeeper keeps a Mosquitto directory's crl.pem in step with the
// revocation list.
type crlKeeper struct {
	c       client.Reader
	ns, dir string
	// pidfile, when set, is Mosquitto's PID file: it is sent SIGHUP after
	// each write.
	pidfile string
}

// crlResult is what one sync did.
type crlResult struct {
	wrote   bool
	revoked int // certificates on the CRLs
	// pid is the Mosquitto that was signalled; 0 for none.
	pid int
}

func (r crlResult) String(dir, pidfile string) string {
	file := filepath.Join(dir, broker.CRLFile)
	switch {
	case !r.wrote:
		return fmt.Sprintf("%s is current: %d revoked certificates", file, r.revoked)
	case pidfile != "":
		return fmt.Sprintf("Wrote %s: %d revoked certificates. Signalled Mosquitto (PID %d) to read it.", file, r.revoked, r.pid)
	default:
		return fmt.Sprintf("Wrote %s: %d revoked certificates. Mosquitto reads it only at start and on SIGHUP: "+
			"restart it or send it SIGHUP (or pass --pidfile) for it to refuse them.", file, r.revoked)
	}
}

// sync signs the CRLs of the revocation list and writes them unless the
// file lists the same certificates already and is not half expired. It
// signs with the CAs of the broker's ca.crt, which must be the current CA:
// Drover holds no other CA key.
func (k *crlKeeper) sync(ctx context.Context, now time.Time) (crlResult, error) {
	var s corev1.Secret
	if err := k.c.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: hub.CASecretName}, &s); err != nil {
		return crlResult{}, fmt.Errorf("read Drover's CA %s/%s: %w", k.ns, hub.CASecretName, err)
	}
	trust, err := hub.ParseTrust(&s)
	if err != nil {
		return crlResult{}, err
	}
	trusted, err := broker.MosquittoCAs(k.dir)
	if err != nil {
		return crlResult{}, err
	}
	signers, err := crlSigners(trust, trusted, k.dir)
	if err != nil {
		return crlResult{}, err
	}
	list, err := revokedList(ctx, k.c, k.ns)
	if err != nil {
		return crlResult{}, err
	}
	crl, err := hub.CRL(signers, list, now)
	if err != nil {
		return crlResult{}, err
	}
	want, _, err := hub.CRLSerials(crl)
	if err != nil {
		return crlResult{}, err
	}
	res := crlResult{}
	for _, s := range want {
		res.revoked += len(s)
	}
	old, err := broker.ReadCRL(k.dir)
	if err != nil {
		return crlResult{}, fmt.Errorf("read the CRL: %w", err)
	}
	if have, next, err := hub.CRLSerials(old); err == nil && next.Sub(now) > hub.CRLValidity/2 &&
		maps.EqualFunc(have, want, slices.Equal[[]string]) {
		return res, nil
	}
	if err := broker.WriteCRL(k.dir, crl); err != nil {
		return crlResult{}, err
	}
	res.wrote = true
	if k.pidfile != "" {
		if res.pid, err = broker.ReloadMosquitto(k.pidfile); err != nil {
			return res, fmt.Errorf("wrote %s but Mosquitto still has the old one: %w", filepath.Join(k.dir, broker.CRLFile), err)
		}
	}
	return res, nil
}

// revokedList reads ns's revocation list; nil when there is none yet.
func revokedList(ctx context.Context, c client.Reader, ns string) (*corev1.ConfigMap, error) {
	var cm corev1.ConfigMap
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: hub.RevokedKeysName}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read the revocation list %s/%s: %w", ns, hub.RevokedKeysName, err)
	}
	return &cm, nil
}

// crlSigners are the CAs that sign the CRLs of trusted: the broker needs
// one for each.
func crlSigners(trust *hub.Trust, trusted []*x509.Certificate, dir string) ([]*pki.CA, error) {
	var out []*pki.CA
	for _, c := range trusted {
		if !bytes.Equal(c.Raw, trust.Current.Cert.Raw) {
			return nil, fmt.Errorf("%s trusts CA %q, which is not Drover's current CA %q: Drover holds no key to sign its CRL. "+
				"Run drover mqtt mosquitto-config again and restart Mosquitto (after a CA rotation, once agents have renewed onto the new CA)",
				filepath.Join(dir, "ca.crt"), c.Subject.CommonName, trust.Current.Cert.Subject.CommonName)
		}
		out = append(out, trust.Current)
	}
	return out, nil
}

// watch syncs now, on every change of the revocation list and every
// crlResync, until ctx ends; failures are logged and retried.
func (k *crlKeeper) watch(ctx context.Context, wc client.WithWatch, log *slog.Logger) error {
	sync := func() {
		res, err := k.sync(ctx, time.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("write the CRL; retrying", "err", err)
		case res.wrote:
			log.Info(res.String(k.dir, k.pidfile))
		}
	}
	tick := time.NewTicker(crlResync)
	defer tick.Stop()
	for ctx.Err() == nil {
		// Watching before reading: a change between the two is not lost.
		w, err := wc.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(k.ns),
			client.MatchingFields{"metadata.name": hub.RevokedKeysName})
		sync()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("watch the revocation list; retrying", "err", err, "retry", crlRetry)
			}
			select {
			case <-ctx.Done():
			case <-time.After(crlRetry):
			}
			continue
		}
		err = k.follow(ctx, w, tick.C, sync)
		w.Stop()
		if err != nil {
			log.Info("the watch of the revocation list ended; watching again", "reason", err)
		}
	}
	return nil
}

// follow syncs on each event of w and each tick until ctx ends (nil) or w
// does (why).
func (k *crlKeeper) follow(ctx context.Context, w watch.Interface, tick <-chan time.Time, sync func()) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			sync()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("closed by the API server")
			}
			if ev.Type == watch.Error {
				return fmt.Errorf("%v", apierrors.FromObject(ev.Object))
			}
			sync()
		}
	}
}
