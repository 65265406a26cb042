// Package broker is the MQTT broker a hub embeds (mochi-mqtt): a TLS
// listener that admits only clients with a certificate from Drover's CA
// whose key the hub admits (Options.Admit), and the topic rule of package
// topics for each of them.
package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
)

// Options configure an embedded broker.
type Options struct {
	// Address is the TLS listen address (host:port; port 0 picks one). Required.
	Address string
	// CA is Drover's CA: it signs the broker's serving certificate and every
	// client certificate the broker accepts. Required unless Certificate
	// and ClientCAs are set.
	CA *pki.CA
	// Certificate, when set, is the broker's serving certificate (a hub's,
	// from its signer) instead of one CA signs.
	Certificate *tls.Certificate
	// ClientCAs, when set, are the CAs client certificates are verified
	// against at each connect (a hub's Hub.TrustedCAs: its CA and those a
	// rotation left trusted). Default: CA.
	ClientCAs func() *x509.CertPool
	// ServingHosts are the names and IPs in the serving certificate.
	// Default: 127.0.0.1, localhost and the host name.
	ServingHosts []string
	// Layout is the topic layout whose rule the broker enforces.
	Layout topics.Layout
	// Logger for operators. Default: discard.
	Logger *slog.Logger
	// Admit, when set, is asked at every connect of a node whether its
	// certificate's key (hex SHA-256, pki.KeyFingerprint) may connect as
	// the node: a hub's Hub.AdmitKey refuses revoked keys and keys the
	// node's FleetNode was not registered with. The certificate alone
	// proves only that the CA once signed it. Default: any certificate of
	// Drover's CA is admitted.
	Admit func(ctx context.Context, node, key string) error
	// Joiners admits clients without a certificate as joiners (package
	// topics, join.go): machines that register over MQTT. Each is confined
	// to its own join request and response topics, may hold no will, and
	// is disconnected after JoinerLifetime. Default false: every client
	// needs a certificate.
	Joiners bool
	// MaxJoiners bounds the joiners connected at once; more are refused
	// (they connect again later). Default 256.
	MaxJoiners int
	// JoinerLifetime bounds one joiner's connection. Default 2 minutes.
	JoinerLifetime time.Duration
}

// admitTimeout bounds one Admit call; a connect that cannot be decided is
// refused (the client connects again).
const admitTimeout = 10 * time.Second

// Broker is a running embedded broker.
type Broker struct {
	srv  *mqtt.Server
	addr string
	log  *slog.Logger
	// refused counts connections and ACL checks the broker refused.
	refused atomic.Int64

	// keysMu guards keys: by client id, the client last admitted with it
	// and its certificate's key. mochi's own client map can lose a client
	// that took an id over (the old one's cleanup may delete the id after
	// the new one is added), so NodeKey does not rely on it.
	keysMu sync.Mutex
	keys   map[string]admitted
	// joiners are the connected joiners by join id (keysMu).
	joiners map[string]*joiner
}

// joiner is a connected client without a certificate.
type joiner struct {
	cl    *mqtt.Client
	addr  net.Addr
	timer *time.Timer // ends the connection at JoinerLifetime
}

// admitted is a client the auth hook admitted.
type admitted struct {
	cl  *mqtt.Client
	key string
}

// Start listens and serves in the background until Close.
func Start(opts Options) (*Broker, error) {
	if opts.CA == nil && (opts.Certificate == nil || opts.ClientCAs == nil) {
		return nil, errors.New("mqtt broker: a CA, or a serving certificate and client CAs, is required")
	}
	if opts.Layout.Prefix == "" {
		opts.Layout.Prefix = topics.DefaultPrefix
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if len(opts.ServingHosts) == 0 {
		opts.ServingHosts = []string{"127.0.0.1", "localhost"}
		if h, err := os.Hostname(); err == nil {
			opts.ServingHosts = append(opts.ServingHosts, h)
		}
	}
	cert, err := servingCert(opts)
	if err != nil {
		return nil, err
	}
	// mochi logs every connect at info: keep its chatter one level down.
	caps := mqtt.NewDefaultServerCapabilities()
	// An envelope is at most protocol.MaxEnvelopeBytes; leave room for the
	// topic and a hub's answers, refuse anything far larger unread.
	caps.MaximumPacketSize = 4 * protocol.MaxEnvelopeBytes
	// The hub's one connection carries every node's dispatches and answers:
	// mochi disconnects a client with more QoS 1 publishes in flight than
	// this, so allow the most MQTT can.
	caps.ReceiveMaximum = math.MaxUint16
	// Nothing in the protocol is retained; a node must not be able to park
	// messages in the broker.
	caps.RetainAvailable = 0
	srv := mqtt.New(&mqtt.Options{Capabilities: caps, Logger: slog.New(quiet{opts.Logger.Handler()})})
	if opts.MaxJoiners <= 0 {
		opts.MaxJoiners = 256
	}
	if opts.JoinerLifetime <= 0 {
		opts.JoinerLifetime = 2 * time.Minute
	}
	b := &Broker{srv: srv, log: opts.Logger, keys: map[string]admitted{}, joiners: map[string]*joiner{}}
	if err := srv.AddHook(&authHook{b: b, layout: opts.Layout, admit: opts.Admit, opts: opts}, nil); err != nil {
		return nil, fmt.Errorf("mqtt broker: %w", err)
	}
	tlsConfig := &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
	if opts.Joiners {
		// A certificate that is given must still verify; a client without
		// one is a joiner, which the auth hook confines.
		tlsConfig.ClientAuth = tls.VerifyClientCertIfGiven
	}
	if opts.CA != nil {
		tlsConfig.ClientCAs = opts.CA.Pool()
	}
	if opts.ClientCAs != nil {
		tlsConfig.ClientCAs = opts.ClientCAs()
		base := tlsConfig.Clone()
		tlsConfig.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := base.Clone()
			c.ClientCAs = opts.ClientCAs()
			return c, nil
		}
	}
	l := listeners.NewTCP(listeners.Config{ID: "drover-tls", Address: opts.Address, TLSConfig: tlsConfig})
	if err := srv.AddListener(l); err != nil {
		return nil, fmt.Errorf("mqtt broker listen on %s: %w", opts.Address, err)
	}
	if err := srv.Serve(); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("mqtt broker: %w", err)
	}
	b.addr = l.Address()
	opts.Logger.Info("mqtt broker serving agents", "address", b.addr, "prefix", opts.Layout.Prefix)
	return b, nil
}

// servingCert is opts.Certificate, or one opts.CA signs.
func servingCert(opts Options) (tls.Certificate, error) {
	if opts.Certificate != nil {
		return *opts.Certificate, nil
	}
	certPEM, keyPEM, err := opts.CA.IssueServing("drover-mqtt", opts.ServingHosts, time.Now(), 365*24*time.Hour)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load mqtt serving certificate: %w", err)
	}
	return cert, nil
}

// Addr is the address the broker listens on.
func (b *Broker) Addr() string { return b.addr }

// URL is the broker's address as a client's broker URL (ssl://host:port),
// with an unspecified listen address replaced by loopback.
func (b *Broker) URL() string {
	host, port, _ := net.SplitHostPort(b.addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "ssl://" + net.JoinHostPort(host, port)
}

// NodeKey is the key (hex SHA-256 of the public key) of the certificate
// node's agent is connected with, if it is connected. A node has one
// connection at most: its client id is fixed (topics.AgentClientID), and
// a new connection with it replaces the old one.
func (b *Broker) NodeKey(node string) (string, bool) {
	b.keysMu.Lock()
	a, ok := b.keys[topics.AgentClientID(node)]
	b.keysMu.Unlock()
	if !ok || a.cl.Closed() {
		return "", false
	}
	return a.key, true
}

// JoinerAddr is the remote address of the connected joiner with join id
// id: the source the hub's registration limits count it under.
func (b *Broker) JoinerAddr(id string) (net.Addr, bool) {
	b.keysMu.Lock()
	defer b.keysMu.Unlock()
	j, ok := b.joiners[id]
	if !ok || j.cl.Closed() {
		return nil, false
	}
	return j.addr, true
}

// Joiners is how many joiners are connected.
func (b *Broker) Joiners() int {
	b.keysMu.Lock()
	defer b.keysMu.Unlock()
	return len(b.joiners)
}

// Refused is how many connections and topic accesses the broker refused.
func (b *Broker) Refused() int64 { return b.refused.Load() }

// Close stops the broker and disconnects its clients.
func (b *Broker) Close() error { return b.srv.Close() }

// Run serves until ctx ends, then closes the broker.
func (b *Broker) Run(ctx context.Context) error {
	<-ctx.Done()
	return b.Close()
}

// identity is who a client's verified certificate says it is.
type identity struct {
	user string
	hub  bool
	key  string // pki.KeyFingerprint of the certificate
}

// peerIdentity reads the verified client certificate of cl's connection.
func (h *authHook) peerIdentity(cl *mqtt.Client) (identity, error) {
	c, err := peerCert(cl)
	if err != nil {
		return identity{}, err
	}
	id, err := certIdentity(c, h.layout)
	id.key = pki.KeyFingerprint(c)
	return id, err
}

// peerCert is the verified client certificate of cl's connection.
func peerCert(cl *mqtt.Client) (*x509.Certificate, error) {
	tc, ok := cl.Net.Conn.(*tls.Conn)
	if !ok {
		return nil, errors.New("not a TLS connection")
	}
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return nil, errNoCertificate
	}
	return st.VerifiedChains[0][0], nil
}

// certIdentity: a hub is the hub of l's prefix (l.HubCN), as in the
// Mosquitto ACL.
func certIdentity(c *x509.Certificate, l topics.Layout) (identity, error) {
	switch {
	case pki.IsOperatorCert(c):
		// Operators read logs from hubs; they have no topic here.
		return identity{}, errors.New("an operator certificate is neither a node's nor a hub's")
	case slices.Contains(c.Subject.Organization, topics.HubOrganization) && c.Subject.CommonName == l.HubCN():
		return identity{user: c.Subject.CommonName, hub: true}, nil
	case slices.Contains(c.Subject.Organization, topics.NodeOrganization):
		return identity{user: c.Subject.CommonName}, nil
	}
	return identity{}, fmt.Errorf("certificate %q is neither a node's nor a hub's", c.Subject.CommonName)
}

// authHook admits clients by certificate and applies the topic rule.
type authHook struct {
	mqtt.HookBase
	b      *Broker
	layout topics.Layout
	admit  func(ctx context.Context, node, key string) error
	opts   Options
}

// errNoCertificate: the connection presented no client certificate.
var errNoCertificate = errors.New("no verified client certificate")

func (h *authHook) ID() string { return "drover-auth" }

func (h *authHook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnDisconnect}, []byte{b})
}

// OnConnectAuthenticate admits a client with a node or hub certificate. The
// user name the client sends is ignored: the certificate names it, as with
// Mosquitto's use_identity_as_username. The client id must be one the
// certificate may use (topics.ClientIDAllowed): mochi disconnects the
// client that had an id when another connects with it. The will is checked
// here because mochi does not check it when it publishes it.
func (h *authHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	id, err := h.peerIdentity(cl)
	if errors.Is(err, errNoCertificate) && h.opts.Joiners {
		return h.admitJoiner(cl, pk)
	}
	if err == nil && !topics.ClientIDAllowed(id.user, id.hub, cl.ID) {
		want := topics.AgentClientID(id.user)
		if id.hub {
			want = topics.HubClientIDPrefix + "<hub>"
		}
		err = fmt.Errorf("client id %q is not %q's (want %q)", cl.ID, id.user, want)
	}
	if err == nil && pk.Connect.WillFlag && !h.layout.Allowed(id.user, id.hub, topics.Publish, pk.Connect.WillTopic) {
		err = fmt.Errorf("will topic %q is not the client's", pk.Connect.WillTopic)
	}
	if err == nil && !id.hub && h.admit != nil {
		ctx, cancel := context.WithTimeout(context.Background(), admitTimeout)
		err = h.admit(ctx, id.user, id.key)
		cancel()
	}
	if err != nil {
		h.b.refused.Add(1)
		h.b.log.Warn("mqtt connection refused", "remote", cl.Net.Remote, "client", cl.ID, "keySHA256", id.key, "err", err)
		return false
	}
	cl.Properties.Username = []byte(id.user)
	if !id.hub {
		h.b.keysMu.Lock()
		h.b.keys[cl.ID] = admitted{cl: cl, key: id.key}
		h.b.keysMu.Unlock()
	}
	return true
}

// admitJoiner admits a client without a certificate as a joiner: a join
// client id, no will, room under MaxJoiners. Its lifetime is bounded, so
// that idle joiners cannot hold every slot.
func (h *authHook) admitJoiner(cl *mqtt.Client, pk packets.Packet) bool {
	jid, ok := topics.JoinIDOf(cl.ID)
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("client id %q: a client without a certificate must be a joiner (%s and 32 hex digits)", cl.ID, topics.JoinClientIDPrefix)
	case pk.Connect.WillFlag:
		err = errors.New("a joiner may not leave a will")
	}
	if err == nil {
		h.b.keysMu.Lock()
		switch old, taken := h.b.joiners[jid]; {
		case taken && !old.cl.Closed():
			err = errors.New("join id in use")
		case len(h.b.joiners) >= h.opts.MaxJoiners:
			err = fmt.Errorf("%d joiners connected already", len(h.b.joiners))
		default:
			j := &joiner{cl: cl, addr: cl.Net.Conn.RemoteAddr()}
			j.timer = time.AfterFunc(h.opts.JoinerLifetime, func() {
				cl.Stop(errors.New("joiner connected too long"))
			})
			h.b.joiners[jid] = j
		}
		h.b.keysMu.Unlock()
	}
	if err != nil {
		h.b.refused.Add(1)
		h.b.log.Warn("mqtt joiner refused", "remote", cl.Net.Remote, "client", clipped(cl.ID), "err", err)
		return false
	}
	cl.Properties.Username = []byte(cl.ID)
	h.b.log.Debug("mqtt joiner connected", "remote", cl.Net.Remote, "joinID", jid)
	return true
}

// clipped is a client-chosen string as it may be logged.
func clipped(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// OnDisconnect forgets a node client's key, unless a newer connection
// took its id over, and a joiner.
func (h *authHook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.b.keysMu.Lock()
	defer h.b.keysMu.Unlock()
	if jid, ok := topics.JoinIDOf(cl.ID); ok {
		if j, ok := h.b.joiners[jid]; ok && j.cl == cl {
			j.timer.Stop()
			delete(h.b.joiners, jid)
		}
		return
	}
	if a, ok := h.b.keys[cl.ID]; ok && a.cl == cl {
		delete(h.b.keys, cl.ID)
	}
}

// OnACLCheck applies the topic rule to a publish (write) or to a
// subscription filter and each message delivered on it (read).
func (h *authHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	a := topics.Subscribe
	if write {
		a = topics.Publish
	}
	id, err := h.peerIdentity(cl)
	if errors.Is(err, errNoCertificate) && h.opts.Joiners {
		// Admitted as a joiner by its client id (admitJoiner).
		jid, _ := topics.JoinIDOf(cl.ID)
		if !h.layout.JoinerAllowed(jid, a, topic) {
			h.b.refused.Add(1)
			h.b.log.Warn("mqtt access refused to a joiner", "remote", cl.Net.Remote, "topic", clipped(topic), "publish", write)
			return false
		}
		return true
	}
	if err != nil {
		h.b.refused.Add(1)
		return false
	}
	if !h.layout.Allowed(id.user, id.hub, a, topic) {
		h.b.refused.Add(1)
		h.b.log.Warn("mqtt access refused", "user", id.user, "topic", topic, "publish", write)
		return false
	}
	return true
}

// quiet lowers mochi's info records to debug.
type quiet struct{ slog.Handler }

func (q quiet) Enabled(ctx context.Context, l slog.Level) bool {
	if l == slog.LevelInfo {
		l = slog.LevelDebug
	}
	return q.Handler.Enabled(ctx, l)
}

func (q quiet) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo {
		r.Level = slog.LevelDebug
	}
	if r.Message == "" {
		// mochi's listeners log the end of every client connection as a
		// bare warning with its error, EOF when the client just left, a
		// closed connection when the broker stops.
		level, msg := r.Level, "mqtt client connection ended with an error"
		r.Attrs(func(a slog.Attr) bool {
			if err, ok := a.Value.Any().(error); ok && a.Key == "error" && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)) {
				level, msg = slog.LevelDebug, "mqtt client disconnected"
			}
			return true
		})
		if !q.Handler.Enabled(ctx, level) {
			return nil
		}
		out := slog.NewRecord(r.Time, level, msg, r.PC)
		r.Attrs(func(a slog.Attr) bool { out.AddAttrs(a); return true })
		r = out
	}
	return q.Handler.Handle(ctx, r)
}

func (q quiet) WithAttrs(as []slog.Attr) slog.Handler { return quiet{q.Handler.WithAttrs(as)} }
func (q quiet) WithGroup(n string) slog.Handler       { return quiet{q.Handler.WithGroup(n)} }
