package taskexec_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// An attempt's argv reaches the program as it is: no shell expands it.
func Example() {
	dir, err := os.MkdirTemp("", "taskexec-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	// The task runs as nobody (when this runs as root): it must reach the
	// work dir, while the state dir is the agent's alone.
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	d, err := taskexec.New(taskexec.Options{StateDir: filepath.Join(dir, "state"), WorkDir: filepath.Join(dir, "work")})
	if err != nil {
		panic(err)
	}
	defer d.Close()

	spec := &taskwire.Spec{Name: "hello", Attempt: 1, Command: []string{"echo", "$HOME", "a;b"}}
	prep, err := d.Prepare(context.Background(), taskwire.WorkID("0b0e", 1), spec)
	if err != nil {
		panic(err)
	}
	proc, err := prep.Start()
	if err != nil {
		panic(err)
	}
	<-proc.Done()
	res := proc.Result()
	fmt.Printf("%s, exit code %d, output %q\n", res.Phase, *res.Report.ExitCode, res.Report.OutputTail)
	// Output:
	// Succeeded, exit code 0, output "$HOME a;b\n"
}
