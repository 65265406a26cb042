package sessionapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/serverless/apptoken"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
	pb "github.com/drover-fleet/drover/pkg/sessionapi/sessionapiv1"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: manager.Scheme()})
	testkit.VerifyNoLeaksAfter(m, stop)
}

// fakeBinder plays the manager's binder and the node's hub: it creates the
// session bound to instance i-1 on edge-1 and, unless the application is
// "slow", writes it Ready shortly after, as a hub would on SessionReady.
type fakeBinder struct{ c client.Client }

func (b fakeBinder) Open(ctx context.Context, ns, app string, data map[string]string, _ *time.Duration) (*serverlessv1.ApplicationSession, error) {
	s := &serverlessv1.ApplicationSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: app + "-"},
		Spec:       serverlessv1.ApplicationSessionSpec{Application: app, Data: data, InstanceName: "i-1", NodeName: "edge-1"},
	}
	if err := b.c.Create(ctx, s); err != nil {
		return nil, err
	}
	if app == "full" {
		s.Status.Phase, s.Status.Reason = serverlessv1.SessionTerminated, serverlessv1.ReasonNoCapacity
		return s, b.c.Status().Update(ctx, s)
	}
	if app != "slow" {
		go func() {
			time.Sleep(20 * time.Millisecond)
			s.Status.Phase = serverlessv1.SessionReady
			s.Status.Endpoint = &serverlessv1.Endpoint{Host: "127.0.0.1", Port: 30001}
			now := metav1.Now()
			s.Status.ReadyTime = &now
			_ = b.c.Status().Update(context.Background(), s)
		}()
	}
	return s, nil
}

type harness struct {
	addr   string
	ns     string
	tokens map[string]string
}

func start(t *testing.T) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ns := "sapi-" + rand.String(5)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(env.Config, cache.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	inf, err := ca.GetInformer(ctx, &serverlessv1.ApplicationSession{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.GetInformer(ctx, &serverlessv1.Application{}); err != nil {
		t.Fatal(err)
	}
	cacheDone := make(chan struct{})
	go func() { defer close(cacheDone); _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	c, err := client.New(env.Config, client.Options{Scheme: manager.Scheme(), Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Opener: fakeBinder{c: env.Client}, Client: c, Sessions: inf})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{ns: ns, tokens: map[string]string{}}
	for _, app := range []string{"echo", "slow", "full", "other"} {
		a := &serverlessv1.Application{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app},
			Spec: serverlessv1.ApplicationSpec{Command: []string{"/bin/echo"}, Session: serverlessv1.SessionPolicy{OpenTimeout: metav1.Duration{Duration: 500 * time.Millisecond}}}}
		tok, err := apptoken.New(ns, app, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		a.Annotations = map[string]string{apptoken.AnnotationKey(tok.ID): tok.AnnotationValue()}
		if err := env.Client.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
		h.tokens[app] = tok.Value
	}
	// The cache must see the applications' tokens before a call.
	testkit.Eventually(t, 30*time.Second, func() string {
		var l serverlessv1.ApplicationList
		if err := ca.List(ctx, &l, client.InNamespace(ns)); err != nil || len(l.Items) != 4 {
			return fmt.Sprintf("cache holds %d applications (%v)", len(l.Items), err)
		}
		return ""
	})
	ready := make(chan string, 1)
	r := &Runnable{Server: srv, Address: "127.0.0.1:0", Ready: func(a string) { ready <- a }}
	runDone := make(chan error, 1)
	go func() { runDone <- r.Start(ctx) }()
	select {
	case h.addr = <-ready:
	case err := <-runDone:
		t.Fatalf("serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the session API did not listen")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("serve: %v", err)
		}
		<-cacheDone
	})
	return h
}

func (h *harness) grpc(t *testing.T, app string) (pb.SessionsClient, context.Context) {
	t.Helper()
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return pb.NewSessionsClient(conn), metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.tokens[app])
}

func TestOpenGetWatchCloseOverGRPC(t *testing.T) {
	h := start(t)
	c, ctx := h.grpc(t, "echo")
	s, err := c.Open(ctx, &pb.OpenRequest{Data: map[string]string{"user": "alice"}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if s.Phase != "Ready" || s.Endpoint.GetPort() != 30001 || s.Node != "edge-1" || s.OpenMillis <= 0 {
		t.Fatalf("Open = %v", s)
	}
	got, err := c.Get(ctx, &pb.GetRequest{Name: s.Name})
	if err != nil || got.Phase != "Ready" || got.Application != "echo" {
		t.Fatalf("Get = %v, %v", got, err)
	}
	// Another application's token sees nothing of it.
	other, octx := h.grpc(t, "other")
	if _, err := other.Get(octx, &pb.GetRequest{Name: s.Name}); status.Code(err) != codes.NotFound {
		t.Fatalf("Get with another application's token: %v, want NotFound", err)
	}
	if _, err := other.Open(octx, &pb.OpenRequest{Application: "echo"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Open of echo with other's token: %v, want PermissionDenied", err)
	}
	w, err := c.Watch(ctx, &pb.GetRequest{Name: s.Name})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil || first.Phase != "Ready" {
		t.Fatalf("first watch event %v, %v", first, err)
	}
	// A hub would terminate it after the close; play that.
	var obj serverlessv1.ApplicationSession
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: s.Name}, &obj); err != nil {
		t.Fatal(err)
	}
	obj.Status.Phase, obj.Status.Reason = serverlessv1.SessionTerminated, serverlessv1.ReasonClosed
	if err := env.Client.Status().Update(ctx, &obj); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("watch ended before Terminated: %v", err)
		}
		if ev.Phase == "Terminated" {
			if ev.Reason != "Closed" {
				t.Fatalf("terminated with reason %q", ev.Reason)
			}
			break
		}
	}
	if _, err := w.Recv(); err != io.EOF {
		t.Fatalf("watch after Terminated: %v, want EOF", err)
	}
	if _, err := c.Close(ctx, &pb.GetRequest{Name: s.Name}); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestOpenFailures(t *testing.T) {
	h := start(t)
	tests := []struct {
		app  string
		tok  string
		want codes.Code
	}{
		{"full", "", codes.ResourceExhausted},
		{"slow", "", codes.DeadlineExceeded},
		{"echo", "garbage", codes.Unauthenticated},
		{"echo", "none", codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.app+"/"+tt.tok, func(t *testing.T) {
			c, ctx := h.grpc(t, tt.app)
			switch tt.tok {
			case "garbage":
				ctx = metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer drvapp.x.y.z"))
			case "none":
				ctx = context.Background()
			}
			_, err := c.Open(ctx, &pb.OpenRequest{OpenTimeoutMillis: 300})
			if status.Code(err) != tt.want {
				t.Fatalf("Open = %v, want %s", err, tt.want)
			}
		})
	}
}

func TestRevokedTokenIsRefused(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	var a serverlessv1.Application
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: "echo"}, &a); err != nil {
		t.Fatal(err)
	}
	a.Annotations = nil
	if err := env.Client.Update(ctx, &a); err != nil {
		t.Fatal(err)
	}
	c, gctx := h.grpc(t, "echo")
	testkit.Eventually(t, 30*time.Second, func() string {
		_, err := c.Get(gctx, &pb.GetRequest{Name: "x"})
		if status.Code(err) != codes.Unauthenticated {
			return fmt.Sprintf("Get with a revoked token: %v, want Unauthenticated", err)
		}
		return ""
	})
}

func TestOpenOverHTTP(t *testing.T) {
	h := start(t)
	do := func(method, path, tok, body string) (*http.Response, string) {
		req, err := http.NewRequest(method, "http://"+h.addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := do("POST", "/v1/sessions", h.tokens["echo"], `{"data": {"user": "bob"}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("POST /v1/sessions: %d %s", resp.StatusCode, body)
	}
	var s struct {
		Name     string `json:"name"`
		Phase    string `json:"phase"`
		Endpoint struct {
			Port int `json:"port"`
		} `json:"endpoint"`
	}
	if err := json.Unmarshal([]byte(body), &s); err != nil || s.Phase != "Ready" || s.Endpoint.Port != 30001 {
		t.Fatalf("open answer %s (%v)", body, err)
	}
	if resp, body := do("GET", "/v1/sessions/"+s.Name, "", ""); resp.StatusCode != 401 || !strings.Contains(body, "Unauthenticated") {
		t.Fatalf("GET without a token: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("POST", "/v1/sessions", h.tokens["full"], `{}`); resp.StatusCode != 429 || !strings.Contains(body, "NoCapacity") {
		t.Fatalf("POST for a full application: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("POST", "/v1/sessions", h.tokens["echo"], `{"bogus": 1}`); resp.StatusCode != 400 {
		t.Fatalf("POST with a bad body: %d %s", resp.StatusCode, body)
	}
	// Watch streams NDJSON: the first line is the current state.
	req, _ := http.NewRequest("GET", "http://"+h.addr+"/v1/sessions/"+s.Name+"/watch", nil)
	req.Header.Set("Authorization", "Bearer "+h.tokens["echo"])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wresp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(wresp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"phase":"Ready"`) {
		t.Fatalf("first watch line %q (%v)", line, err)
	}
	cancel()
	wresp.Body.Close()
	if resp, body := do("DELETE", "/v1/sessions/"+s.Name, h.tokens["echo"], ""); resp.StatusCode != 200 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, body)
	}
}
