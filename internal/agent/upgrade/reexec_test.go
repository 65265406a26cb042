package upgrade

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

// helperEnv makes the test binary act as an agent process that runs one
// upgrade with the real syscall.Exec (see TestMain).
const helperEnv = "DROVER_UPGRADE_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain())
	}
	testkit.VerifyNoLeaks(m)
}

// helperMain upgrades the binary at $EXE from $URL and re-execs it as
// `$EXE --version`: on success the process becomes the new agent, which
// prints its version and exits 0.
func helperMain() int {
	ctx := context.Background()
	state := os.Getenv("STATE")
	db, err := store.Open(ctx, filepath.Join(state, "agent.db"), store.Options{})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	exe := os.Getenv("EXE")
	r := &Runner{StateDir: state, Executable: exe, CurrentVersion: oldVersion, DB: db, Args: []string{exe, "--version"}}
	spec := fmt.Sprintf(`{"job":"j","version":%q,"url":%q,"sha256":%q}`, newVersion, os.Getenv("URL"), os.Getenv("SHA"))
	phase, reason := r.Run(ctx, "job", []byte(spec), func(context.Context, string, nodejobwire.Report) error { return nil })
	fmt.Printf("Run returned: %s %s\n", phase, reason)
	return 1
}

func TestRealReExecStartsTheNewBinary(t *testing.T) {
	old, new, _ := agents(t)
	ctx := testCtx(t)
	url := serve(t, map[string]string{"/new": new.path})
	n := newNode(t, old)
	n.db.Close() // the helper process opens it

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "STATE="+n.state, "EXE="+n.exe, "URL="+url+"/new", "SHA="+new.sha)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != newVersion {
		t.Fatalf("helper = %v, output %q; want the re-exec'd new binary to print %s", err, out, newVersion)
	}
	if sha, _ := n.installed(); sha != new.sha {
		t.Errorf("installed binary = %s, want the new one", sha)
	}
}
