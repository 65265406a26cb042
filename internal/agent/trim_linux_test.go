package agent

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rssFileKiB is this process's resident file-backed memory (its binary's
// pages, for a static Go test binary).
func rssFileKiB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatalf("read /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("RssFile %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

func TestTrimBinaryPagesUnmapsTheBinary(t *testing.T) {
	before := rssFileKiB(t)
	advised := trimBinaryPages()
	after := rssFileKiB(t)
	t.Logf("advised %d KiB; RssFile %d KiB before, %d KiB after", advised/1024, before, after)
	if advised <= 0 {
		t.Fatal("trimBinaryPages advised no mapping of the test binary")
	}
	// The test keeps running code of its binary, so some pages come back at
	// once; what start-up mapped (most of a large test binary) must not. A
	// test run a second time (-count) may start after an earlier trim, with
	// little left to unmap.
	if after >= before && before > 8<<10 {
		t.Errorf("RssFile %d KiB after the trim, want less than the %d KiB before", after, before)
	}
}

func TestKeepMemoryTrimmedStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		KeepMemoryTrimmed(ctx, 0, 10*time.Millisecond)
	}()
	time.Sleep(100 * time.Millisecond) // a few rounds: a collection and a trim each
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("KeepMemoryTrimmed did not return after its context was cancelled")
	}
}

func TestKeepMemoryTrimmedOffWithoutPeriod(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		KeepMemoryTrimmed(t.Context(), 0, 0)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("KeepMemoryTrimmed with no period did not return at once")
	}
}
