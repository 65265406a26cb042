package instance

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/testkit"
)

// modeEnv makes the test binary an instance program: "echo" (a TCP echo
// server on DROVER_PORT), "http" (/healthz 200, else 500), "exit" (exits 3).
const modeEnv = "INSTANCE_TEST_MODE"

// TestMain: the test binary also stands in for drover-agent as the v1
// cgroup start shim and the log shim, and for the instances' programs.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == cgroup.ShimArg {
		os.Exit(cgroup.RunShim(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == taskexec.LogShimArg {
		os.Exit(taskexec.RunLogShim(os.Args[2:]))
	}
	switch os.Getenv(modeEnv) {
	case "echo":
		os.Exit(echo())
	case "http":
		os.Exit(serveHTTP())
	case "exit":
		os.Exit(3)
	}
	testkit.VerifyNoLeaks(m)
}

func echo() int {
	l, err := net.Listen("tcp", ":"+os.Getenv(EnvPort))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return 1
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				fmt.Fprintf(c, "%s\n", sc.Text())
			}
		}()
	}
}

func serveHTTP() int {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe(":"+os.Getenv(EnvPort), h))
	return 1
}
