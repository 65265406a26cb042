package taskhub

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/protocol/operatorv1"
	"github.com/drover-fleet/drover/internal/task/tasklogs"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testenv"
)

// operator dials the hub's Operator service with cert (nil: none) and, if
// token is set, a bearer token.
func (f *fixture) operator(cert *tls.Certificate, token string) (operatorv1.OperatorClient, func(context.Context) context.Context) {
	f.t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.caPEM())
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { conn.Close() })
	withToken := func(ctx context.Context) context.Context {
		if token == "" {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return operatorv1.NewOperatorClient(conn), withToken
}

// readLogs reads a TaskLogs stream to its end: the bytes, and whether the
// last chunk said eof.
func readLogs(ctx context.Context, c operatorv1.OperatorClient, req *operatorv1.TaskLogsRequest, onData func(string)) (string, bool, error) {
	s, err := c.TaskLogs(ctx, req)
	if err != nil {
		return "", false, err
	}
	var out strings.Builder
	eof := false
	for {
		ch, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out.String(), eof, nil
		}
		if err != nil {
			return out.String(), eof, err
		}
		out.Write(ch.GetData())
		eof = eof || ch.GetEof()
		if onData != nil && len(ch.GetData()) > 0 {
			onData(out.String())
		}
	}
}

// adminCert is the control plane's admin identity (system:masters).
func adminCert(t *testing.T) *tls.Certificate {
	t.Helper()
	cfg := env.Config.TLSClientConfig
	c, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
	if err != nil {
		t.Fatalf("admin kubeconfig certificate: %v", err)
	}
	return &c
}

// signedCert issues a client certificate for cn/orgs from the CA in dir.
func signedCert(t *testing.T, caCertPEM, caKeyPEM []byte, cn string, orgs ...string) *tls.Certificate {
	t.Helper()
	caCert, err := pki.ParseCert(caCertPEM)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := pki.ParseKey(caKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// kubeUserCert is a certificate from the kube-apiserver's client CA.
func kubeUserCert(t *testing.T, cn string, orgs ...string) *tls.Certificate {
	t.Helper()
	dir := filepath.Join(env.DataDir, "pki")
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	return signedCert(t, certPEM, keyPEM, cn, orgs...)
}

func TestTaskLogs(t *testing.T) {
	f := start(t)
	gate, open := f.gate("go")
	task := f.schedule("chatty", "/bin/sh", "-c", `echo "line one"; echo "to stderr" >&2; `+waitFor(gate)+`; echo "line two"`)
	f.waitState(task, batchv1.TaskRunning)
	admin, _ := f.operator(adminCert(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	// What is there so far, then the end of the stream.
	req := &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name}
	testenv.Eventually(t, waitTimeout, "stdout so far", func(context.Context) (bool, error) {
		got, eof, err := readLogs(ctx, admin, req, nil)
		if err != nil {
			return false, err
		}
		if got != "line one\n" || !eof {
			return false, errors.New("got " + got)
		}
		return true, nil
	})
	got, _, err := readLogs(ctx, admin, &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name, Stream: "stderr"}, nil)
	if err != nil || got != "to stderr\n" {
		t.Errorf("stderr = %q, %v", got, err)
	}
	got, _, err = readLogs(ctx, admin, &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name, TailBytes: 4}, nil)
	if err != nil || got != "one\n" {
		t.Errorf("the last 4 bytes = %q, %v", got, err)
	}

	// Following: the first line, then the gate opens, the second line,
	// and the stream ends with the task.
	opened := false
	got, eof, err := readLogs(ctx, admin, &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name, Follow: true}, func(sofar string) {
		if !opened && strings.Contains(sofar, "line one") {
			opened = true
			open()
		}
	})
	if err != nil {
		t.Fatalf("follow: %v (got %q)", err, got)
	}
	if got != "line one\nline two\n" || !eof {
		t.Errorf("follow got %q (eof %v), want both lines and the end", got, eof)
	}
	f.waitState(task, batchv1.TaskCompleted)
}

func TestTaskLogsAccess(t *testing.T) {
	f := start(t)
	task := f.schedule("secret", "/bin/sh", "-c", "echo classified")
	f.waitState(task, batchv1.TaskCompleted)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req := &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name}
	wantCode := func(what string, c operatorv1.OperatorClient, wrap func(context.Context) context.Context, code codes.Code) {
		t.Helper()
		got, _, err := readLogs(wrap(ctx), c, req, nil)
		if status.Code(err) != code {
			t.Errorf("%s: %v (got %q), want %s", what, err, got, code)
		}
	}

	// A user the kube-apiserver knows, without RBAC.
	nobody, wrap := f.operator(kubeUserCert(t, "nobody"), "")
	wantCode("a user certificate without RBAC", nobody, wrap, codes.PermissionDenied)

	// A node certificate, even a node's own, is not an operator.
	var caSecret corev1.Secret
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.droverNS, Name: hub.CASecretName}, &caSecret); err != nil {
		t.Fatal(err)
	}
	nodeCert := signedCert(t, caSecret.Data[corev1.TLSCertKey], caSecret.Data[corev1.TLSPrivateKeyKey], f.node, "drover:nodes")
	node, wrap := f.operator(nodeCert, "")
	wantCode("a node certificate", node, wrap, codes.PermissionDenied)
	// And a certificate from the kube-apiserver's CA, now accepted on the
	// listener, does not pass for a node.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.caPEM())
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*kubeUserCert(t, f.node, "drover:nodes")}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = agentv1.NewAgentHubClient(conn).SendMessage(ctx, protocol.NewHeartbeat(f.node))
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("a node-like certificate from the kube-apiserver's CA: %v, want Unauthenticated", err)
	}

	anon, wrap := f.operator(nil, "")
	wantCode("no credentials", anon, wrap, codes.Unauthenticated)

	bogus, wrap := f.operator(nil, "not-a-token")
	wantCode("a bad token", bogus, wrap, codes.Unauthenticated)

	// A bearer token, even a valid one, never authenticates at a hub: the
	// hub could replay it. The refusal tells the user what to do.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "reader"}}
	if err := f.c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}
	if err := f.c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("token for %s: %v", sa.Name, err)
	}
	tokenOnly, wrap := f.operator(nil, tr.Status.Token)
	wantCode("a valid token", tokenOnly, wrap, codes.Unauthenticated)
	if _, _, err := readLogs(wrap(ctx), tokenOnly, req, nil); err == nil || !strings.Contains(err.Error(), "update drover") {
		t.Errorf("a token's refusal %v: want it to say to update drover", err)
	}

	// Operator certificates of Drover's CA (what the manager's signer
	// gives for a reviewed token): the hub asks the kube-apiserver about
	// the identity the certificate carries.
	ca, err := pki.ParseCA(caSecret.Data[corev1.TLSCertKey], caSecret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	saID := pki.OperatorIdentity{User: "system:serviceaccount:" + f.ns + ":reader", UID: string(sa.UID),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + f.ns, "system:authenticated"}}
	reader, wrap := f.operator(operatorCert(t, ca, saID), "")
	wantCode("an operator certificate without RBAC", reader, wrap, codes.PermissionDenied)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "task-logs"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"batch.drover.io"}, Resources: []string{"tasks/log"}, Verbs: []string{"get"}}}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "task-logs"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: f.ns, Name: sa.Name}}}
	for _, o := range []client.Object{role, rb} {
		if err := f.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, waitTimeout, "the operator certificate reads the log once RBAC allows its identity", func(context.Context) (bool, error) {
		got, _, err := readLogs(wrap(ctx), reader, req, nil)
		if err != nil {
			return false, err
		}
		if got != "classified\n" {
			return false, errors.New("got " + got)
		}
		return true, nil
	})
	// The same RBAC does not let another identity in: the SAR is the
	// certificate's.
	other, wrap := f.operator(operatorCert(t, ca, pki.OperatorIdentity{User: "mallory", Groups: []string{"system:authenticated"}}), "")
	wantCode("another identity's operator certificate", other, wrap, codes.PermissionDenied)
	// A token beside a valid certificate changes nothing: the certificate
	// decides.
	both, wrap := f.operator(operatorCert(t, ca, saID), "not-a-token")
	if got, _, err := readLogs(wrap(ctx), both, req, nil); err != nil || got != "classified\n" {
		t.Errorf("an operator certificate with a token beside it: %q, %v", got, err)
	}

	// An operator certificate is no node: no session, no message.
	opConn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*operatorCert(t, ca, pki.OperatorIdentity{User: f.node, Groups: []string{"drover:nodes"}})}})))
	if err != nil {
		t.Fatal(err)
	}
	defer opConn.Close()
	agent := agentv1.NewAgentHubClient(opConn)
	if _, err := agent.SendMessage(ctx, protocol.NewHeartbeat(f.node)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("an operator certificate sends a node's message: %v, want PermissionDenied", err)
	}
	gm, err := agent.GetMessage(ctx, &agentv1.GetMessageRequest{})
	if err == nil {
		_, err = gm.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("an operator certificate opens a node's session: %v, want PermissionDenied", err)
	}
}

// operatorCert is an operator certificate of ca for id, as the manager's
// signer makes them.
func operatorCert(t *testing.T, ca *pki.CA, id pki.OperatorIdentity) *tls.Certificate {
	t.Helper()
	keyPEM, csr, err := pki.NewKeyAndCSR("ignored")
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignOperatorCSR(csr, id, time.Now(), pki.OperatorValidity)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(pki.EncodeCert(der), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func ptrTo[T any](v T) *T { return &v }

// drover logs' client finds the node's hub from the API, and follows the
// node to its hub when asked at another one.
func TestLogsClient(t *testing.T) {
	f := start(t)
	task := f.schedule("client", "/bin/sh", "-c", "echo via the client")
	f.waitState(task, batchv1.TaskCompleted)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	o := tasklogs.Options{Config: env.Config, Client: f.c, DroverNamespace: f.droverNS, CAPEM: f.caPEM(), Namespace: f.ns, Name: task.Name}

	testenv.Eventually(t, waitTimeout, "the hub's Lease names its address", func(context.Context) (bool, error) {
		var out strings.Builder
		if err := tasklogs.Copy(ctx, o, &out); err != nil {
			return false, err
		}
		if out.String() != "via the client\n" {
			return false, errors.New("got " + out.String())
		}
		return true, nil
	})

	// Another hub, which the node is not connected to, sends the client on.
	other, err := hub.New(hub.Options{Name: "other-" + f.hub.Name(), Client: f.c, Namespace: f.droverNS, ListenAddress: "127.0.0.1:0",
		ServingHosts: []string{"127.0.0.1"}, Features: []hub.Feature{logsOnly{f.d}}})
	if err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := context.WithCancel(context.Background())
	hdone := make(chan error, 1)
	go func() { hdone <- other.Start(hctx) }()
	defer func() {
		hcancel()
		select {
		case <-hdone:
		case <-time.After(stopTimeout):
			t.Errorf("the other hub still runs %s after stop", stopTimeout)
		}
	}()
	addr, err := other.Addr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o.Hub = addr.String()
	var out strings.Builder
	if err := tasklogs.Copy(ctx, o, &out); err != nil || out.String() != "via the client\n" {
		t.Errorf("asked at another hub: %q, %v", out.String(), err)
	}
}

// The agent reads the rotated file first, and follows a log across a
// rotation (the full file renamed to .1, a new one started).
func TestTaskLogsRotation(t *testing.T) {
	f := start(t)
	gate, open := f.gate("go")
	task := f.schedule("rotating", "/bin/sh", "-c", waitFor(gate))
	running := f.waitState(task, batchv1.TaskRunning)
	dir := filepath.Join(f.stateDir, "tasks", taskwire.WorkID(string(running.UID), 1))
	cur := filepath.Join(dir, "stdout.log")
	appendTo := func(path, s string) {
		t.Helper()
		fh, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		if _, err := fh.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	// Our own log rotation, as the exec driver does it.
	appendTo(cur, "one\n")
	admin, _ := f.operator(adminCert(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	step := 0
	got, eof, err := readLogs(ctx, admin, &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name, Follow: true}, func(sofar string) {
		switch {
		case step == 0 && sofar == "one\n":
			step++
			// Written just before the rotation, after the reader's position.
			appendTo(cur, "two\n")
			if err := os.Rename(cur, cur+".1"); err != nil {
				t.Error(err)
			}
			appendTo(cur, "three\n")
		case step == 1 && strings.HasSuffix(sofar, "three\n"):
			step++
			open()
		}
	})
	if err != nil || !eof || got != "one\ntwo\nthree\n" {
		t.Errorf("followed across a rotation: %q (eof %v), %v; want one, two, three and the end", got, eof, err)
	}
	f.waitState(task, batchv1.TaskCompleted)

	// From the start: the rotated file, then the current one; a tail
	// reaches back into the rotated file.
	for _, tc := range []struct {
		tail uint64
		want string
	}{{0, "one\ntwo\nthree\n"}, {8, "o\nthree\n"}, {3, "ee\n"}} {
		got, _, err := readLogs(ctx, admin, &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name, TailBytes: tc.tail}, nil)
		if err != nil || got != tc.want {
			t.Errorf("tail %d: %q, %v; want %q", tc.tail, got, err, tc.want)
		}
	}
}

// TestEarlierAttemptLogs: the log of an attempt that a newer one replaced
// is read from the node it ran on, through the hub and the client.
func TestEarlierAttemptLogs(t *testing.T) {
	f := start(t)
	mark := filepath.Join(t.TempDir(), "ran")
	task := f.schedule("again", "/bin/sh", "-c", `if [ -e `+mark+` ]; then echo "attempt 2"; else touch `+mark+`; echo "attempt 1"; fi`)
	done := f.waitState(task, batchv1.TaskCompleted)
	// Attempt 2, as the manager starts it (a restart or a reschedule).
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	first := done.Status
	// The hub may still be writing the ended task: retry on a conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(done), done); err != nil {
			return err
		}
		done.Status = batchv1.TaskStatus{State: batchv1.TaskScheduled, Reason: batchv1.ReasonScheduled, NodeName: f.node, Attempt: 2,
			History: []batchv1.TaskAttempt{{Attempt: 1, Node: f.node, State: first.State, Reason: first.Reason, ExitCode: first.ExitCode}}}
		return f.c.Status().Update(ctx, done)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "attempt 2 completed", func(ctx context.Context) (bool, error) {
		var tk batchv1.Task
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(task), &tk); err != nil {
			return false, err
		}
		return tk.Status.Attempt == 2 && tk.Status.State == batchv1.TaskCompleted, nil
	})
	admin, _ := f.operator(adminCert(t), "")
	for attempt, want := range map[int32]string{0: "attempt 2\n", 2: "attempt 2\n", 1: "attempt 1\n"} {
		got, _, err := readLogs(ctx, admin, &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name, Attempt: attempt}, nil)
		if err != nil || got != want {
			t.Errorf("attempt %d: %q, %v; want %q", attempt, got, err, want)
		}
	}
	_, _, err := readLogs(ctx, admin, &operatorv1.TaskLogsRequest{Namespace: f.ns, Name: task.Name, Attempt: 3}, nil)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "has no attempt 3") {
		t.Errorf("attempt 3: %v, want FailedPrecondition saying there is none", err)
	}
	o := tasklogs.Options{Config: env.Config, Client: f.c, DroverNamespace: f.droverNS, CAPEM: f.caPEM(), Namespace: f.ns, Name: task.Name, Attempt: 1}
	testenv.Eventually(t, waitTimeout, "the client reads attempt 1", func(ctx context.Context) (bool, error) {
		var out strings.Builder
		if err := tasklogs.Copy(ctx, o, &out); err != nil {
			return false, err
		}
		if out.String() != "attempt 1\n" {
			return false, fmt.Errorf("got %q", out.String())
		}
		return true, nil
	})
}

// logsOnly is a hub feature that finds task logs with d and carries no
// work: a second hub must not take d's link to the first one.
type logsOnly struct{ d *Dispatcher }

var _ hub.LogFinder = logsOnly{}

func (logsOnly) Name() string                                                 { return "tasklogs" }
func (logsOnly) Owns(string) bool                                             { return false }
func (logsOnly) Assigned(context.Context, string, string) bool                { return false }
func (logsOnly) Attach(hub.Link)                                              {}
func (logsOnly) WorkFor(context.Context, string) ([]*agentv1.WorkItem, error) { return nil, nil }
func (logsOnly) WorkStatus(context.Context, string, *agentv1.WorkStatus)      {}
func (logsOnly) NodeState(context.Context, string, []*agentv1.WorkStatus)     {}

func (l logsOnly) LogTarget(ctx context.Context, namespace, name string, attempt int32) (string, string, error) {
	return l.d.LogTarget(ctx, namespace, name, attempt)
}
