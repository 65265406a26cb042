package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
)

const waitTimeout = 10 * time.Second

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func clientTLS(t *testing.T, signer, trusted *pki.CA, cn, org string) *tls.Config {
	t.Helper()
	certPEM, keyPEM, err := ClientCert(signer, cn, org, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(trusted.Cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// operatorTLS is a client with an operator certificate of ca (what the
// signer gives `drover logs`).
func operatorTLS(t *testing.T, ca *pki.CA) *tls.Config {
	t.Helper()
	keyPEM, csr, err := pki.NewKeyAndCSR("n1")
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignOperatorCSR(csr, pki.OperatorIdentity{User: "alice", Groups: []string{"system:masters"}}, time.Now(), pki.OperatorValidity)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(der), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// connect tries to connect and returns the error (nil when admitted).
func connect(t *testing.T, url, id string, cfg *tls.Config, will string) error {
	t.Helper()
	o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetTLSConfig(cfg).SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitTimeout)
	if will != "" {
		o.SetWill(will, "gone", 1, false)
	}
	c := paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(waitTimeout) {
		t.Fatalf("connect %s: no answer within %v", id, waitTimeout)
	}
	if tok.Error() == nil {
		c.Disconnect(0)
	}
	return tok.Error()
}

// TestBrokerAdmitsOnlyDroverCertificates: the TLS listener and the auth hook
// admit nodes and hubs with certificates from Drover's CA, and nothing else.
func TestBrokerAdmitsOnlyDroverCertificates(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	l, _ := topics.New("")
	b, err := Start(Options{Address: "127.0.0.1:0", CA: ca, ServingHosts: []string{"127.0.0.1"}, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cases := []struct {
		name  string
		cfg   *tls.Config
		id    string
		will  string
		admit bool
	}{
		{"a node", clientTLS(t, ca, ca, "n1", topics.NodeOrganization), topics.AgentClientID("n1"), "", true},
		{"a node with its own will", clientTLS(t, ca, ca, "n1", topics.NodeOrganization), topics.AgentClientID("n1"), l.Register("n1"), true},
		{"a node with another node's will", clientTLS(t, ca, ca, "n1", topics.NodeOrganization), topics.AgentClientID("n1"), l.Register("n2"), false},
		{"a hub", clientTLS(t, ca, ca, l.HubCN(), topics.HubOrganization), topics.HubClientID("h1"), "", true},
		{"a hub of another prefix", clientTLS(t, ca, ca, topics.HubUser+":other", topics.HubOrganization), topics.HubClientID("h1"), "", false},
		{"a hub organization with another name", clientTLS(t, ca, ca, "n1", topics.HubOrganization), topics.HubClientID("h1"), "", false},
		{"a certificate of neither kind", clientTLS(t, ca, ca, "n1", "someone"), topics.AgentClientID("n1"), "", false},
		{"another CA's node certificate", clientTLS(t, other, ca, "n1", topics.NodeOrganization), topics.AgentClientID("n1"), "", false},
		{"no certificate", &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, topics.AgentClientID("n1"), "", false},
		// Operators read logs at hubs; at a broker they are nobody.
		{"an operator certificate, a node's id", operatorTLS(t, ca), topics.AgentClientID("n1"), "", false},
		{"an operator certificate, its own name as id", operatorTLS(t, ca), topics.AgentClientID(pki.OperatorCommonName), "", false},
		{"an operator certificate, a hub's id", operatorTLS(t, ca), topics.HubClientID("h1"), "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := connect(t, b.URL(), tc.id, tc.cfg, tc.will)
			if (err == nil) != tc.admit {
				t.Errorf("admitted=%v (err %v), want %v", err == nil, err, tc.admit)
			}
		})
	}
	if b.Refused() == 0 {
		t.Error("the broker counted no refusals")
	}
}

// TestBrokerRefusesOthersClientIDs: a node certificate cannot connect with
// a hub's client id or another node's, which would disconnect that client;
// the clients that own those ids stay connected.
func TestBrokerRefusesOthersClientIDs(t *testing.T) {
	ca := newCA(t)
	l, _ := topics.New("")
	var logs syncBuffer
	b, err := Start(Options{Address: "127.0.0.1:0", CA: ca, ServingHosts: []string{"127.0.0.1"}, Layout: l,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The victims: a hub and node m-3, connected with their own ids.
	lost := make(chan string, 4)
	stay := func(id string, cfg *tls.Config) paho.Client {
		c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(id).SetTLSConfig(cfg).
			SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitTimeout).
			SetConnectionLostHandler(func(_ paho.Client, err error) { lost <- id + ": " + err.Error() }))
		if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
			t.Fatalf("%s: connect: %v", id, tok.Error())
		}
		t.Cleanup(func() { c.Disconnect(0) })
		return c
	}
	hubID, victimID := topics.HubClientID("hub-b"), topics.AgentClientID("m-3")
	stay(hubID, clientTLS(t, ca, ca, l.HubCN(), topics.HubOrganization))
	stay(victimID, clientTLS(t, ca, ca, "m-3", topics.NodeOrganization))

	intruder := clientTLS(t, ca, ca, "m-4", topics.NodeOrganization)
	refused := b.Refused()
	for _, id := range []string{hubID, victimID, "m-3", "drover:hub:drover", ""} {
		if err := connect(t, b.URL(), id, intruder, ""); err == nil {
			t.Errorf("node m-4 connected with client id %q", id)
		}
	}
	// paho tries MQTT 3.1.1, then 3.1: one or two refusals each.
	if got := b.Refused() - refused; got < 5 {
		t.Errorf("refused counter rose by %d, want at least 5", got)
	}
	if !strings.Contains(logs.String(), `msg="mqtt connection refused"`) || !strings.Contains(logs.String(), `client id \"drover-hub-hub-b\" is not \"m-4\"'s`) {
		t.Errorf("no refusal logged for the hub's id:\n%s", logs.String())
	}
	// The intruder's own id works, and a hub certificate may not take an agent's id either.
	if err := connect(t, b.URL(), topics.AgentClientID("m-4"), intruder, ""); err != nil {
		t.Errorf("node m-4 with its own client id: %v", err)
	}
	if err := connect(t, b.URL(), victimID, clientTLS(t, ca, ca, l.HubCN(), topics.HubOrganization), ""); err == nil {
		t.Errorf("a hub certificate connected with node m-3's client id")
	}
	select {
	case l := <-lost:
		t.Errorf("a victim was disconnected: %s", l)
	case <-time.After(200 * time.Millisecond):
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestWriteMosquitto(t *testing.T) {
	ca := newCA(t)
	a, _ := topics.New("fleet/a")
	b, _ := topics.New("fleet/b")
	dir := t.TempDir()
	conf, err := WriteMosquitto(ca, MosquittoConfig{Dir: dir, Listen: "127.0.0.1:8883", Layouts: []topics.Layout{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	if conf != dir+"/mosquitto.conf" {
		t.Errorf("config at %s", conf)
	}
	acl, err := os.ReadFile(dir + "/acl")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"topic readwrite fleet/a/#", "topic readwrite fleet/b/#", "pattern read fleet/b/nodes/%u/tasks/dispatch"} {
		if !strings.Contains(string(acl), want+"\n") {
			t.Errorf("acl lacks %q", want)
		}
	}
	if _, err := WriteMosquitto(ca, MosquittoConfig{Dir: dir, Listen: "no-port"}); err == nil {
		t.Error("a listen address without a port was accepted")
	}
}

// TestMosquittoKeyReadableAfterDroppingRoot: written as root (as Debian
// starts Mosquitto), the key belongs to the group of the user Mosquitto
// drops to, or it could not read it and would not start.
func TestMosquittoKeyReadableAfterDroppingRoot(t *testing.T) {
	u, err := user.Lookup("mosquitto")
	if os.Geteuid() != 0 || err != nil {
		t.Skipf("needs root and a mosquitto user (.ci/run installs Debian's mosquitto, which adds it): euid %d, %v", os.Geteuid(), err)
	}
	dir := t.TempDir()
	if _, err := WriteMosquitto(newCA(t), MosquittoConfig{Dir: dir, Listen: "127.0.0.1:8883"}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if fmt.Sprint(sys.Gid) != u.Gid || st.Mode().Perm() != 0o640 {
		t.Errorf("server.key: gid %d mode %v, want gid %s (mosquitto) and 0640", sys.Gid, st.Mode().Perm(), u.Gid)
	}
}

// mochi's bare warning at the end of each client connection becomes a
// debug line with a message when the client just left (EOF), and a warning
// that says what it is otherwise.
func TestQuietRewritesBareConnectionWarnings(t *testing.T) {
	var buf strings.Builder
	log := slog.New(quiet{slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})})
	log.Warn("", "error", io.EOF)
	if buf.Len() != 0 {
		t.Errorf("a client leaving logged at warn: %s", buf.String())
	}
	log.Warn("", "error", errors.New("tls: bad certificate"))
	if got := buf.String(); !strings.Contains(got, `level=WARN msg="mqtt client connection ended with an error"`) || !strings.Contains(got, "bad certificate") {
		t.Errorf("got %q", got)
	}
	buf.Reset()
	log.Info("client connected")
	if buf.Len() != 0 {
		t.Errorf("info is lowered to debug: got %q", buf.String())
	}
}

// TestBrokerAdmitsOnlyKeysTheHubAdmits: a node certificate from Drover's
// CA connects only if Admit accepts its key (a revoked key, or the old key
// of a node registered again, is refused); hubs are not asked; NodeKey
// names the key of the node's connection.
func TestBrokerAdmitsOnlyKeysTheHubAdmits(t *testing.T) {
	ca := newCA(t)
	l, _ := topics.New("")
	good := clientTLS(t, ca, ca, "n1", topics.NodeOrganization)
	goodCert, err := x509.ParseCertificate(good.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	goodKey := pki.KeyFingerprint(goodCert)
	var mu sync.Mutex
	var asked []string
	b, err := Start(Options{Address: "127.0.0.1:0", CA: ca, ServingHosts: []string{"127.0.0.1"}, Layout: l,
		Admit: func(_ context.Context, node, key string) error {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, node)
			if node == "n1" && key == goodKey {
				return nil
			}
			return errors.New("certificate key does not match the key node n1 registered with")
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := connect(t, b.URL(), topics.AgentClientID("n1"), clientTLS(t, ca, ca, "n1", topics.NodeOrganization), ""); err == nil {
		t.Error("a certificate for another key of n1 was admitted")
	}
	if err := connect(t, b.URL(), topics.HubClientID("h1"), clientTLS(t, ca, ca, l.HubCN(), topics.HubOrganization), ""); err != nil {
		t.Errorf("the hub: %v", err)
	}
	c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(topics.AgentClientID("n1")).SetTLSConfig(good).
		SetAutoReconnect(false).SetConnectTimeout(waitTimeout))
	if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("n1 with its registered key: %v", tok.Error())
	}
	defer c.Disconnect(0)
	if key, ok := b.NodeKey("n1"); !ok || key != goodKey {
		t.Errorf("NodeKey(n1) = %q, %v; want %q", key, ok, goodKey)
	}
	if _, ok := b.NodeKey("n2"); ok {
		t.Error("NodeKey(n2) found a connection")
	}
	mu.Lock()
	defer mu.Unlock()
	// paho tries a refused connect again with MQTT 3.1: n1 is asked more
	// than twice; the hub never.
	if len(asked) < 2 || slices.ContainsFunc(asked, func(n string) bool { return n != "n1" }) {
		t.Errorf("Admit asked for %v, want n1 only (no hub), at least twice", asked)
	}
}
