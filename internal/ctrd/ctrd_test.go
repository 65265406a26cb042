package ctrd_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-fleet/drover/internal/ctrd"
	"github.com/drover-fleet/drover/internal/ctrdtest"
)

// daemon is the containerd of this test binary, started by TestMain.
var daemon *ctrdtest.Daemon

func TestMain(m *testing.M) {
	// The test binary is the companion too.
	if len(os.Args) > 1 && ctrd.IsCommand(os.Args[1]) {
		os.Exit(ctrd.Main(os.Args[1:]))
	}
	os.Exit(ctrdtest.RunTests(m, &daemon))
}

// companion runs the companion (this binary) and returns its exit code,
// stdout, stderr and result.
func companion(t *testing.T, args ...string) (int, string, string, ctrd.Result) {
	t.Helper()
	result := filepath.Join(t.TempDir(), "result.json")
	full := append([]string{args[0], "--address", daemon.Address, "--result", result}, args[1:]...)
	cmd := exec.Command(os.Args[0], full...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	res, _, rerr := ctrd.ReadResult(result)
	if rerr != nil {
		t.Fatal(rerr)
	}
	return code, stdout.String(), stderr.String(), res
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		oom    bool
		reason string
	}{
		{name: "prints and exits 0 as its user", args: []string{"--image", ctrdtest.ImageRef, "--user", "1234:5678", "--env", "FOO=bar", "--",
			"/testprog", "echo", "hello", "id", "env", "FOO"}, stdout: "hello\nuid=1234 gid=5678 groups=[5678]\nFOO=bar\n"},
		{name: "exit code", args: []string{"--image", ctrdtest.ImageRef, "--user", "1:1", "--", "/testprog", "exit", "3"}, code: 3},
		{name: "over its memory limit is OOM-killed", args: []string{"--image", ctrdtest.ImageRef, "--user", "1:1", "--memory", "33554432", "--",
			"/testprog", "alloc", "200", "sleep", "10s"}, code: 137, oom: true},
		{name: "missing image", args: []string{"--image", "drover.test/nope:1", "--user", "1:1"}, code: ctrd.ExitNotRun, reason: ctrd.ReasonImageNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := strings.ReplaceAll(t.Name(), "/", "-")
			id = strings.ReplaceAll(id, " ", "-")
			code, stdout, stderr, res := companion(t, append([]string{"run", "--id", id}, tc.args...)...)
			if code != tc.code || res.OOMKilled != tc.oom || res.Reason != tc.reason {
				t.Fatalf("run = code %d, result %+v, want code %d oom %v reason %q; stderr: %s", code, res, tc.code, tc.oom, tc.reason, stderr)
			}
			if tc.stdout != "" && stdout != tc.stdout {
				t.Errorf("stdout = %q, want %q", stdout, tc.stdout)
			}
			if tc.reason == "" && (!res.Ran || res.ExitCode != int32(tc.code)) {
				t.Errorf("result = %+v, want ran with exit code %d", res, tc.code)
			}
		})
	}
}
