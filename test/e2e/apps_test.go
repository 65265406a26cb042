package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
	"github.com/drover-fleet/drover/pkg/sessionapi/sessionapiv1"
)

// appTimeout bounds an instance's way to Standby (start, liveness, freeze)
// and a session's open on a loaded machine.
const appTimeout = 90 * time.Second

// installEcho copies the example application to a dir the instances' user
// (nobody) can read, and returns its path.
func installEcho(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(testenv.Binary(t, "./examples/echo-session"))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(openDir(t), "echo-session")
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// instances reads the instances of app from its slices, by state.
func instances(t *testing.T, c *cluster, ns, app string) map[serverlessv1.InstanceState][]serverlessv1.InstanceStatus {
	t.Helper()
	var l serverlessv1.InstanceSliceList
	if err := c.client.List(context.Background(), &l, client.InNamespace(ns), client.MatchingLabels{serverlessv1.LabelApplication: app}); err != nil {
		t.Fatal(err)
	}
	out := map[serverlessv1.InstanceState][]serverlessv1.InstanceStatus{}
	for _, s := range l.Items {
		for _, in := range s.Status.Instances {
			out[in.State] = append(out[in.State], in)
		}
	}
	return out
}

// running counts the processes running bin.
func running(bin string) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(b), bin+"\x00") {
			n++
		}
	}
	return n
}

var openedRE = regexp.MustCompile(`session (\S+) opened in (\S+) on node (\S+)`)
var endpointRE = regexp.MustCompile(`endpoint: (\S+)`)

// TestApplications runs the example echo application on a real agent:
// a standby instance is kept, a session opened with the CLI is served by it
// (a real TCP client joins, the session goes Live), closed, and the pool is
// refilled.
func TestApplications(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	tok := c.token(t, true, time.Hour)
	// The instances (nobody) reach their session sockets only through
	// dirs that let every user through: t.TempDir's do not.
	c.startAgent(t, "sim-1", t.TempDir(), "--hub", c.hub, "--token", tok, "--labels", "kind=sim",
		"--session-socket-dir", filepath.Join(openDir(t), "s"))
	c.waitPhase(t, "sim-1", fleetv1.FleetNodeOnline, defaultTimeout)
	bin := installEcho(t)
	const ns = "default"
	// Before the agent stops (cleanups run last first): a stopped agent
	// leaves its instances running, for the next agent to find.
	t.Cleanup(func() {
		_ = c.client.Delete(context.Background(), &serverlessv1.Application{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns}})
		testkit.Eventually(t, appTimeout, func() string {
			if n := running(bin); n > 0 {
				return fmt.Sprintf("%d instance processes left after the application was deleted", n)
			}
			return ""
		})
	})
	app := &serverlessv1.Application{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec: serverlessv1.ApplicationSpec{
			Command:       []string{bin},
			Ports:         []serverlessv1.Port{{Name: "echo"}},
			LivenessProbe: &serverlessv1.Probe{TCP: true},
			NodeSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"kind": "sim"}},
		}}
	if err := c.client.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, appTimeout, func() string {
		if got := instances(t, c, ns, "echo"); len(got[serverlessv1.InstanceStandby]) != 1 {
			out, _ := c.cli(t, "get", "instances", "echo", "-o", "wide")
			return fmt.Sprintf("instances by state %v; want one Standby\n%s", got, out)
		}
		return ""
	})
	out, err := c.cli(t, "get", "apps")
	if err != nil || !strings.Contains(out, "echo") {
		t.Errorf("drover get apps (err %v):\n%s", err, out)
	}

	out, err = c.cli(t, "session", "open", "echo", "--data", "user=alice")
	if err != nil {
		t.Fatalf("drover session open: %v\n%s", err, out)
	}
	m, ep := openedRE.FindStringSubmatch(out), endpointRE.FindStringSubmatch(out)
	if m == nil || ep == nil || m[3] != "sim-1" {
		t.Fatalf("drover session open printed:\n%s", out)
	}
	name := m[1]
	conn, err := net.DialTimeout("tcp", ep[1], 10*time.Second)
	if err != nil {
		t.Fatalf("connect to the session's endpoint %s: %v", ep[1], err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(conn)
	// The instance knows a session by its work id: sess-<object uid>.
	var obj serverlessv1.ApplicationSession
	if err := c.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &obj); err != nil {
		t.Fatal(err)
	}
	greeting, err := r.ReadString('\n')
	if err != nil || !strings.Contains(greeting, "sess-"+string(obj.UID)) {
		t.Fatalf("greeting %q (%v), want one naming session sess-%s (%s)", greeting, err, obj.UID, name)
	}
	fmt.Fprintln(conn, "hello drover")
	if echo, err := r.ReadString('\n'); err != nil || strings.TrimSpace(echo) != "hello drover" {
		t.Fatalf("echo %q (%v)", echo, err)
	}
	testkit.Eventually(t, appTimeout, func() string {
		var s serverlessv1.ApplicationSession
		if err := c.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			return err.Error()
		}
		if s.Status.Phase != serverlessv1.SessionLive || len(s.Status.Clients) != 1 {
			return fmt.Sprintf("session status %+v, want Live with one client", s.Status)
		}
		return ""
	})
	out, err = c.cli(t, "describe", "session", name)
	for _, want := range []string{"Phase:        Live", "Node:         sim-1", "user=alice", "Open took:"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("drover describe session lacks %q (err %v):\n%s", want, err, out)
		}
	}

	out, err = c.cli(t, "session", "close", name)
	if err != nil || !strings.Contains(out, "closed") {
		t.Fatalf("drover session close: %v\n%s", err, out)
	}
	// The client was told to leave: the instance closed the connection.
	if _, err := r.ReadString('\n'); err == nil {
		t.Error("the client's connection stayed open after the session closed")
	}
	// The session API, as a customer without Kubernetes access uses it: an
	// application token, then gRPC.
	out, err = c.cli(t, "app", "token", "create", "echo", "--ttl", "1h")
	tokRE := regexp.MustCompile(`(?m)^(drvapp\.\S+)$`)
	tm := tokRE.FindStringSubmatch(out)
	am := regexp.MustCompile(`session API listening on (\S+)`).FindStringSubmatch(c.server.Output())
	if err != nil || tm == nil || am == nil {
		t.Fatalf("drover app token create (err %v):\n%s\nsession API address found: %v", err, out, am != nil)
	}
	conn2, err := grpc.NewClient(am[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	api := sessionapiv1.NewSessionsClient(conn2)
	actx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tm[1]), appTimeout)
	defer cancel()
	opened, err := api.Open(actx, &sessionapiv1.OpenRequest{Data: map[string]string{"user": "bob"}})
	if err != nil || opened.GetPhase() != "Ready" || opened.GetEndpoint().GetPort() == 0 || opened.GetNode() != "sim-1" {
		t.Fatalf("session API Open = %v, %v", opened, err)
	}
	if _, err := api.Open(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer drvapp.bogus.0123456789.x"), &sessionapiv1.OpenRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Open with a bogus token: %v, want Unauthenticated", err)
	}
	if _, err := api.Close(actx, &sessionapiv1.GetRequest{Name: opened.GetName()}); err != nil {
		t.Fatalf("session API Close: %v", err)
	}

	// The standby pool is refilled (the used instance idles, or another
	// standby is made).
	testkit.Eventually(t, appTimeout, func() string {
		if got := instances(t, c, ns, "echo"); len(got[serverlessv1.InstanceStandby]) < 1 {
			return fmt.Sprintf("instances by state %v; want a Standby again", got)
		}
		return ""
	})
}
