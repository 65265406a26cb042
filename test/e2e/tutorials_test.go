package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// Tutorials under docs/tutorials/ that say `<!-- tutorial: runnable -->` are
// run as written by TestTutorials:
//
//   - a fenced block whose info string has `file=NAME` (```yaml file=job.yaml)
//     is written to NAME in the tutorial's directory;
//   - a ```console block is a list of commands (`$ ` lines; a line ending in
//     `\` continues) each followed by the output it must print: every
//     shown line must match a line of the real output, in order, token by
//     token (runs of spaces are one separator; `<anything>` matches any one
//     token; an output line may have more tokens after the shown ones, and
//     the output may have lines not shown). A line `...` shows nothing.
//     A command is run again, up to commandTimeout, until its output
//     matches, because what it shows may take a moment to be true;
//   - other blocks (```sh: what the reader runs in the first terminal, such
//     as `drover up`) are not run, and neither is a block right after a
//     `<!-- tutorial: skip -->` line.
//
// Commands run with bash in the tutorial's directory (holding .drover, the
// data dir of the `drover up --agents 3` the test starts there, with
// loopback ports of its own), with bin/drover and bin/drover-agent there
// being the test's builds, and with the variables exported by earlier
// commands.

const (
	// commandTimeout bounds one tutorial command, retries included.
	commandTimeout = 2 * time.Minute
	tutorialDir    = "docs/tutorials"
)

// tutorialStep is one thing a tutorial does.
type tutorialStep struct {
	line int // in the Markdown file, for failure messages
	// file, when set, is written with content.
	file, content string
	// cmd, when set, is run and its output must show want.
	cmd  string
	want []string
}

var fenceRE = regexp.MustCompile("^```\\s*(\\S*)(.*)$")

// parseTutorial returns the steps of a tutorial, and whether it is marked
// runnable (run by TestTutorials).
func parseTutorial(text string) (steps []tutorialStep, runnable bool, err error) {
	lines := strings.Split(text, "\n")
	for _, l := range lines {
		if strings.TrimSpace(l) == "<!-- tutorial: runnable -->" {
			runnable = true
		}
	}
	prev := ""
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			if strings.TrimSpace(lines[i]) != "" {
				prev = strings.TrimSpace(lines[i])
			}
			continue
		}
		start := i + 1
		end := start
		for end < len(lines) && !strings.HasPrefix(lines[end], "```") {
			end++
		}
		if end == len(lines) {
			return nil, runnable, fmt.Errorf("line %d: unclosed code block", i+1)
		}
		body := lines[start:end]
		skip := prev == "<!-- tutorial: skip -->"
		i, prev = end, ""
		if skip {
			continue
		}
		lang, attrs := m[1], m[2]
		if f := regexp.MustCompile(`\bfile=(\S+)`).FindStringSubmatch(attrs); f != nil {
			steps = append(steps, tutorialStep{line: start, file: f[1], content: strings.Join(body, "\n") + "\n"})
			continue
		}
		if lang != "console" {
			continue
		}
		for j := 0; j < len(body); j++ {
			l := body[j]
			if !strings.HasPrefix(l, "$ ") {
				if len(steps) == 0 || steps[len(steps)-1].cmd == "" {
					return nil, runnable, fmt.Errorf("line %d: output %q before any command", start+j+1, l)
				}
				if t := strings.TrimSpace(l); t != "" && t != "..." {
					steps[len(steps)-1].want = append(steps[len(steps)-1].want, l)
				}
				continue
			}
			st := tutorialStep{line: start + j + 1, cmd: strings.TrimPrefix(l, "$ ")}
			for strings.HasSuffix(st.cmd, "\\") && j+1 < len(body) {
				j++
				st.cmd += "\n" + body[j]
			}
			steps = append(steps, st)
		}
	}
	return steps, runnable, nil
}

// outputShows reports whether out shows every line of want, in order, and
// if not, the first line it misses.
func outputShows(out string, want []string) (bool, string) {
	got := strings.Split(out, "\n")
	k := 0
	for _, w := range want {
		wt := strings.Fields(w)
		found := false
		for ; k < len(got); k++ {
			if tokensMatch(wt, strings.Fields(got[k])) {
				found, k = true, k+1
				break
			}
		}
		if !found {
			return false, w
		}
	}
	return true, ""
}

func tokensMatch(want, got []string) bool {
	if len(got) < len(want) {
		return false
	}
	for i, w := range want {
		if !tokenMatches(w, got[i]) {
			return false
		}
	}
	return true
}

// placeholderRE finds the placeholders of a shown token: `<digest>` in
// `name:tag@<digest>`. `<none>` is what kubectl prints, not a placeholder.
var placeholderRE = regexp.MustCompile(`<[a-z0-9-]+>`)

func tokenMatches(want, got string) bool {
	if want == got {
		return true
	}
	parts := placeholderRE.Split(want, -1)
	if len(parts) == 1 || strings.Contains(want, "<none>") {
		return false
	}
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile(`^` + strings.Join(parts, `\S+`) + `$`).MatchString(got)
}

func TestTutorialParser(t *testing.T) {
	text := "# T\n<!-- tutorial: runnable -->\n```sh\ndrover up\n```\n" +
		"```yaml file=a.yaml\nkind: X\n```\n" +
		"```console\n$ echo a \\\n  b\na b\n...\n$ true\n```\n" +
		"<!-- tutorial: skip -->\n```console\n$ false\n```\n"
	steps, ok, err := parseTutorial(text)
	if err != nil || !ok {
		t.Fatalf("parseTutorial = %v, %v", ok, err)
	}
	if _, ok, _ := parseTutorial("# T\n```console\n$ true\n```\n"); ok {
		t.Errorf("a tutorial without the marker is runnable")
	}
	if len(steps) != 3 || steps[0].file != "a.yaml" || steps[0].content != "kind: X\n" ||
		steps[1].cmd != "echo a \\\n  b" || len(steps[1].want) != 1 || steps[2].cmd != "true" || steps[2].want != nil {
		t.Fatalf("parseTutorial steps = %+v", steps)
	}
	for _, tc := range []struct {
		out  string
		want []string
		ok   bool
	}{
		{"NAME  AGE\nnode-1   Online   3s\n", []string{"node-1 Online <age>"}, true},
		{"node-1 Online 3s from default namespace\n", []string{"node-1 Online <age>"}, true},
		{"node-1 Offline 3s\n", []string{"node-1 Online <age>"}, false},
		{"b\na\n", []string{"a", "b"}, false},
		{"x <none>\n", []string{"x <none>"}, true},
		{"x 3\n", []string{"x <none>"}, false},
		{"img r/a:demo@sha256:0f (layout /a/b)\n", []string{"img r/a:demo@<digest> (layout <path>)"}, true},
		{"img r/b:demo@sha256:0f\n", []string{"img r/a:demo@<digest>"}, false},
	} {
		if ok, _ := outputShows(tc.out, tc.want); ok != tc.ok {
			t.Errorf("outputShows(%q, %q) = %v, want %v", tc.out, tc.want, ok, tc.ok)
		}
	}
}

// TestTutorials runs each runnable tutorial against a fresh `drover up
// --agents 3`, as a reader would.
func TestTutorials(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: needs real drover processes and a kube-apiserver; run without -short")
	}
	root := testenv.RepoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, tutorialDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		steps, ok, err := parseTutorial(string(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !ok {
			continue
		}
		ran++
		name := strings.TrimSuffix(filepath.Base(f), ".md")
		t.Run(name, func(t *testing.T) { runTutorial(t, filepath.Join(tutorialDir, filepath.Base(f)), steps) })
	}
	if ran == 0 {
		t.Fatalf("no runnable tutorial in %s", tutorialDir)
	}
}

func runTutorial(t *testing.T, doc string, steps []tutorialStep) {
	drover := testenv.Binary(t, "./cmd/drover")
	agent := testenv.Binary(t, "./cmd/drover-agent", "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v0.0.1-e2e")
	// The reader's checkout: bin/ with the two binaries, .drover with the
	// fleet's state. 0755, as a checkout is: the agents' tasks run as an
	// unprivileged user and need to pass through it.
	ws := openDir(t)
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(ws, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for n, p := range map[string]string{"drover": drover, "drover-agent": agent} {
		if err := os.Symlink(p, filepath.Join(bin, n)); err != nil {
			t.Fatal(err)
		}
	}
	up := start(t, "drover up", drover, "up", "--agents", "3", "--agent-binary", agent, "--data-dir", filepath.Join(ws, ".drover"),
		"--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0", "--metrics-bind-address", "0")
	up.waitLine(t, readyRE, startTimeout)
	up.waitLine(t, regexp.MustCompile(`^3/3 agents Online$`), defaultTimeout)

	runSteps(t, doc, ws, steps)
}

// runSteps runs a tutorial's steps in ws, as described at the top of this
// file.
func runSteps(t *testing.T, doc, ws string, steps []tutorialStep) {
	state := filepath.Join(t.TempDir(), "exports")
	env := []string{}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECONFIG=") {
			env = append(env, e)
		}
	}
	for _, st := range steps {
		if st.file != "" {
			if err := os.WriteFile(filepath.Join(ws, st.file), []byte(st.content), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		script := fmt.Sprintf("set -o pipefail\n[ -f %[1]q ] && . %[1]q\n%[2]s\nrc=$?\nexport -p > %[1]q\nexit $rc\n", state, st.cmd)
		var out string
		var runErr error
		why := testkit.Wait(context.Background(), commandTimeout, func() string {
			ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-c", script)
			cmd.Dir, cmd.Env = ws, env
			// What a command leaves running (a server started with &) is
			// in its process group, stopped when the tutorial ends; it
			// must not hold the output pipe open either.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cmd.WaitDelay = 10 * time.Second
			defer func() {
				if cmd.Process != nil {
					pgid := cmd.Process.Pid
					t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGTERM) })
				}
			}()
			b, err := cmd.CombinedOutput()
			out, runErr = string(b), err
			if err != nil {
				return fmt.Sprintf("exit: %v", err)
			}
			if ok, missing := outputShows(out, st.want); !ok {
				return fmt.Sprintf("output does not show %q", missing)
			}
			return ""
		})
		if why != "" {
			t.Fatalf("%s:%d: $ %s\n%s within %v (last error %v); output:\n%s\nwant it to show:\n%s",
				doc, st.line, st.cmd, why, commandTimeout, runErr, out, strings.Join(st.want, "\n"))
		}
	}
}

// TestTutorialsLive runs tutorials by hand against a `drover up --agents 3`
// already running at the root of this checkout, as a reader would, with
// the commands run from there (so `go build ./cmd/...` works):
//
//	drover up --agents 3    # in another terminal, at the repository root
//	DROVER_TUTORIALS_LIVE=agent-upgrade,image-prepull go test ./test/e2e -run TestTutorialsLive -count=1 -v
//
// It also runs the tutorials TestTutorials does not (they compile programs
// and serve on fixed ports, which CI must not depend on). It changes the
// fleet as the tutorials say.
func TestTutorialsLive(t *testing.T) {
	names := os.Getenv("DROVER_TUTORIALS_LIVE")
	if names == "" {
		t.Skip("set DROVER_TUTORIALS_LIVE=name,… (files of docs/tutorials without .md) with drover up running at the repository root")
	}
	root := testenv.RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, ".drover", "kubeconfig")); err != nil {
		t.Fatalf("no drover up at %s: %v", root, err)
	}
	for _, name := range strings.Split(names, ",") {
		doc := filepath.Join(tutorialDir, name+".md")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(root, doc))
			if err != nil {
				t.Fatal(err)
			}
			steps, _, err := parseTutorial(string(b))
			if err != nil {
				t.Fatal(err)
			}
			runSteps(t, doc, root, steps)
		})
	}
}
