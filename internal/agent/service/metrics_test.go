package service

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/testenv"
)

// The real agent, with metrics-addr from its config file, serves its
// metrics while it tries to reach a hub that is not there: the session
// errors it counts are what an operator alerts on.
func TestAgentServesMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the real agent")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "agent.yaml")
	hub := closedAddr(t)
	text := "node: metrics-test\nhub: [" + hub + "]\nca-file: " + caFile(t) + "\ncgroups: \"off\"\n" +
		"state-dir: " + filepath.Join(dir, "state") + "\nmetrics-addr: 127.0.0.1:0\n"
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testenv.Binary(t, "./cmd/drover-agent"), "--config="+cfg)
	cmd.Env = append(os.Environ(), "DROVER_TOKEN=abcdef.0123456789abcdef")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls, read := make(chan string, 1), make(chan struct{})
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-read // EOF once the agent has exited; Wait only after the reads
		_ = cmd.Wait()
	}()
	go func() {
		defer close(read)
		re := regexp.MustCompile(`url=(http://\S+/metrics)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log(sc.Text())
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case urls <- m[1]:
				default:
				}
			}
		}
	}()
	var url string
	select {
	case url = <-urls:
	case <-time.After(processTimeout):
		t.Fatalf("the agent did not log its metrics URL within %s", processTimeout)
	}
	deadline := time.Now().Add(processTimeout)
	var body string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		cancel()
		// Every hub and work type has its series from the start, at 0.
		if strings.Contains(body, "drover_agent_info{version=") &&
			strings.Contains(body, "\ndrover_agent_connected{hub=\""+hub+"\"} 0\n") &&
			strings.Contains(body, "\ndrover_agent_work_running{type=\"task-exec\"} 0\n") &&
			strings.Contains(body, "\ndrover_agent_work_finished_total{type=\"nodejob-upgrade\",phase=\"Failed\"} 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape %s: want drover_agent_info and the work families within %s; last body:\n%s", url, processTimeout, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
