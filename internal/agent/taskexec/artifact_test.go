package taskexec

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/task/taskwire"
)

func TestArtifactSizeLimit(t *testing.T) {
	const limit = 1 << 20
	const big = 64 << 20 // more than the socket buffers between server and client can hold
	zeros := make([]byte, big)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(zeros[:8<<20])
	zw.Close()
	atLimit := bytes.Repeat([]byte("x"), limit)
	sumAt := sha256.Sum256(atLimit)

	var wrote atomic.Int64
	handled := make(chan struct{}, 1)
	// writeAll writes body in pieces until it is all out or the client left.
	writeAll := func(w http.ResponseWriter, body []byte) {
		for len(body) > 0 {
			n, err := w.Write(body[:min(len(body), 64<<10)])
			wrote.Add(int64(n))
			if err != nil {
				return
			}
			body = body[n:]
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { handled <- struct{}{} }()
		switch r.URL.Path {
		case "/honest": // says how big it is
			w.Header().Set("Content-Length", strconv.Itoa(big))
			writeAll(w, zeros)
		case "/chunked": // says nothing
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			writeAll(w, zeros)
		case "/gzip": // says 8 KiB, and is 8 MiB once decoded
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Length", strconv.Itoa(gz.Len()))
			writeAll(w, gz.Bytes())
		case "/at-limit":
			writeAll(w, atLimit)
		}
	}))
	defer srv.Close()
	d := newDriver(t, Options{MaxArtifactBytes: limit})
	anySum := strings.Repeat("0", 64)

	for i, tt := range []struct {
		path string
		sent int64 // the server must not have sent this much: the download stopped early
	}{
		{"/honest", big},
		{"/chunked", big},
		{"/gzip", 0},
	} {
		t.Run(tt.path, func(t *testing.T) {
			wrote.Store(0)
			id := "task-big-" + strconv.Itoa(i)
			url := srv.URL + tt.path
			_, err := d.Prepare(context.Background(), id, &taskwire.Spec{Command: []string{"true"},
				Artifacts: []taskwire.Artifact{{URL: url, SHA256: anySum, Path: "data/model.bin"}}})
			var e *Error
			if !errors.As(err, &e) || e.Reason != taskwire.ReasonArtifact {
				t.Fatalf("Prepare = %v, want an %s error", err, taskwire.ReasonArtifact)
			}
			for _, say := range []string{url, "1048576 bytes", "1 MiB", "--max-artifact-bytes"} {
				if !strings.Contains(err.Error(), say) {
					t.Errorf("error %q does not say %q", err, say)
				}
			}
			select {
			case <-handled:
			case <-time.After(testTimeout):
				t.Fatal("the server is still sending: the download was not stopped")
			}
			if tt.sent > 0 && wrote.Load() >= tt.sent {
				t.Errorf("the server sent all %d bytes: the limit was not enforced while downloading", wrote.Load())
			}
			entries, _ := os.ReadDir(filepath.Join(d.WorkDir(id), "data"))
			if len(entries) != 0 {
				t.Errorf("left %v in the working dir", entries)
			}
		})
	}

	t.Run("at the limit", func(t *testing.T) {
		spec := &taskwire.Spec{Command: []string{"true"},
			Artifacts: []taskwire.Artifact{{URL: srv.URL + "/at-limit", SHA256: hex.EncodeToString(sumAt[:]), Path: "model.bin"}}}
		prep, err := d.Prepare(context.Background(), "task-big-ok", spec)
		if err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		prep.Close()
		<-handled
		if fi, err := os.Stat(filepath.Join(d.WorkDir("task-big-ok"), "model.bin")); err != nil || fi.Size() != limit {
			t.Errorf("artifact %v, %v; want %d bytes", fi, err, limit)
		}
	})
}

func TestByteSize(t *testing.T) {
	for n, want := range map[int64]string{
		10: "10 B", 1024: "1 KiB", 1536: "1.5 KiB", 1 << 20: "1 MiB", DefaultMaxArtifactBytes: "1 GiB", 5 << 40: "5 TiB",
	} {
		if got := byteSize(n); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
}
