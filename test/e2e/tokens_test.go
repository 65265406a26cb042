package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/encoding/prototext"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/protocol/operatorv1"
)

// logReader makes a ServiceAccount of ns that may read task logs there
// and find hubs (the roles config/rbac installs), and returns a
// kubeconfig with its bearer token only, and the token.
func (c *cluster) logReader(t *testing.T, ns, name string) (kubeconfig, token string) {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}}
	for _, o := range []client.Object{sa,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-logs"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "drover-task-log-reader"}, Subjects: subject},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name + "-hub-locator"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "drover-hub-locator"}, Subjects: subject},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "drover-system", Name: ns + "-" + name + "-hub-locator"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "drover-hub-locator"}, Subjects: subject},
	} {
		if err := c.client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}
	if err := c.client.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("token of %s/%s: %v", ns, name, err)
	}
	admin, err := clientcmd.LoadFromFile(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = cluster
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: name, Namespace: ns}
	cfg.CurrentContext = "c"
	kubeconfig = filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, tr.Status.Token
}

// droverAs runs `drover ARGS` with kubeconfig, in an empty dir (no
// .drover/ca.crt: Drover's CA comes from the public bundle).
func (c *cluster) droverAs(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(c.drover, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// recordingHub is a hub as a compromised one would be: it serves the
// operator API with a certificate of Drover's CA and keeps everything a
// client sends it (metadata, requests, the client certificate).
type recordingHub struct {
	operatorv1.UnimplementedOperatorServer
	mu    sync.Mutex
	seen  []string // every metadata value and request, as text
	certs []*x509.Certificate
	addr  string
}

func (r *recordingHub) record(ctx context.Context, req string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	md, _ := metadata.FromIncomingContext(ctx)
	for k, vs := range md {
		for _, v := range vs {
			r.seen = append(r.seen, k+": "+v)
		}
	}
	r.seen = append(r.seen, req)
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			r.certs = append(r.certs, ti.State.PeerCertificates[0])
		}
	}
}

func (r *recordingHub) TaskLogs(req *operatorv1.TaskLogsRequest, s grpc.ServerStreamingServer[agentv1.LogChunk]) error {
	r.record(s.Context(), prototext.Format(req))
	return s.Send(&agentv1.LogChunk{Data: []byte("recorded\n"), Eof: true})
}

// saw reports whether any call carried s, and how many calls there were.
func (r *recordingHub) saw(s string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.seen {
		if strings.Contains(v, s) {
			return true, len(r.certs)
		}
	}
	return false, len(r.certs)
}

// startRecordingHub serves a recordingHub on loopback, with a serving
// certificate signed by Drover's CA (read with the admin's kubeconfig), so
// that the CLI trusts it as it trusts a hub.
func (c *cluster) startRecordingHub(t *testing.T) *recordingHub {
	t.Helper()
	var sec corev1.Secret
	if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: "drover-system", Name: hub.CASecretName}, &sec); err != nil {
		t.Fatal(err)
	}
	tr, err := hub.ParseTrust(&sec)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := tr.Current.IssueServing("drover-hub-recorder", []string{"127.0.0.1"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	// Client certificates of Drover's CA are asked for, as a hub does.
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: tr.Pool()})))
	r := &recordingHub{}
	operatorv1.RegisterOperatorServer(srv, r)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	r.addr = lis.Addr().String()
	return r
}

// checkTokenNeverReachesHubs runs `drover logs TASK` (a task of ns) with a
// token-only kubeconfig: against a recording hub, which must see an
// operator certificate of the token's identity and not the token; then
// against the real hub, which must serve the log. A direct call with the
// token shows the recorder would have seen it.
func (c *cluster) checkTokenNeverReachesHubs(t *testing.T, ns, task string) {
	t.Helper()
	kubeconfig, token := c.logReader(t, ns, "e2e-log-reader")
	rec := c.startRecordingHub(t)

	out, err := c.droverAs(t, kubeconfig, "logs", task, "--hub", rec.addr)
	if err != nil || !strings.Contains(out, "recorded") {
		t.Fatalf("drover logs with a token kubeconfig, at the recording hub: %v\n%s", err, out)
	}
	sawToken, calls := rec.saw(token)
	if calls != 1 {
		t.Fatalf("the recording hub got %d calls with a client certificate, want 1", calls)
	}
	if sawToken {
		t.Error("the token reached the hub")
	}
	if saw, _ := rec.saw("authorization"); saw {
		t.Error("an authorization header reached the hub")
	}
	rec.mu.Lock()
	leaf := rec.certs[0]
	rec.mu.Unlock()
	id, err := pki.OperatorIdentityOf(leaf)
	if err != nil || id.User != "system:serviceaccount:"+ns+":e2e-log-reader" {
		t.Errorf("the hub got certificate %v (identity %+v, %v): want an operator certificate of the service account", leaf.Subject, id, err)
	}
	// Valid 10 minutes from signing (from 5 minutes before, for skew).
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life != pki.OperatorValidity+5*time.Minute {
		t.Errorf("the operator certificate lives %s, want 10 minutes after signing", life)
	}

	// The real hub, found from the API, serves the log to the certificate.
	if out, err := c.droverAs(t, kubeconfig, "logs", task); err != nil {
		t.Errorf("drover logs with a token kubeconfig, at the task's hub: %v\n%s", err, out)
	}

	// The check can fail: a client that sends its token is seen.
	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(c.ca)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(caPEM)
	conn, err := grpc.NewClient(rec.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	s, err := operatorv1.NewOperatorClient(conn).TaskLogs(ctx, &operatorv1.TaskLogsRequest{Namespace: ns, Name: task})
	if err == nil {
		_, err = s.Recv()
	}
	if err != nil {
		t.Fatalf("a direct call to the recording hub: %v", err)
	}
	if saw, _ := rec.saw(token); !saw {
		t.Error("the recording hub did not see a token sent to it: the check above proves nothing")
	}
}
