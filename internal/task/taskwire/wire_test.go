package taskwire

import (
	"strings"
	"testing"
)

func TestWorkID(t *testing.T) {
	id := WorkID("7c1f6a6e-0b0e-4f7e-9d57-1a2b3c4d5e6f", 12)
	uid, n, ok := ParseWorkID(id)
	if !ok || uid != "7c1f6a6e-0b0e-4f7e-9d57-1a2b3c4d5e6f" || n != 12 {
		t.Fatalf("ParseWorkID(%q) = %q %d %v", id, uid, n, ok)
	}
	for _, bad := range []string{"", "task-", "task-x", "task-x-0", "task-x-y", "job-x-1", "task--1"} {
		if _, _, ok := ParseWorkID(bad); ok {
			t.Errorf("ParseWorkID(%q) ok, want not", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	const d = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ok := func() Spec { return Spec{Command: []string{"/bin/sh", "-c", "echo $(id); `x`"}} }
	tests := []struct {
		name   string
		mutate func(*Spec)
		want   string
	}{
		{"shell characters in argv are data", func(*Spec) {}, ""},
		{"no command", func(s *Spec) { s.Command = nil }, "name a program"},
		{"NUL in arg", func(s *Spec) { s.Command = []string{"a", "b\x00c"} }, "NUL"},
		{"bad env", func(s *Spec) { s.Env = []string{"A;B=1"} }, "env[0]"},
		{"env without =", func(s *Spec) { s.Env = []string{"A"} }, "env[0]"},
		{"relative dir", func(s *Spec) { s.WorkingDir = "tmp/out" }, ""},
		{"absolute dir", func(s *Spec) { s.WorkingDir = "/srv/data" }, ""},
		{"climbing dir", func(s *Spec) { s.WorkingDir = "a/../../etc" }, "'..'"},
		{"parent dir", func(s *Spec) { s.WorkingDir = ".." }, "'..'"},
		{"newline in dir", func(s *Spec) { s.WorkingDir = "a\nb" }, "newline"},
		{"NUL in dir", func(s *Spec) { s.WorkingDir = "/a\x00b" }, "NUL"},
		{"run as", func(s *Spec) { s.RunAsUser, s.RunAsGroup = ptr(int64(1234)), ptr(int64(0)) }, ""},
		{"negative uid", func(s *Spec) { s.RunAsUser = ptr(int64(-1)) }, "runAsUser"},
		{"gid too large", func(s *Spec) { s.RunAsGroup = ptr(int64(MaxID + 1)) }, "runAsGroup"},
		{"climbing artifact", func(s *Spec) { s.Artifacts = []Artifact{{URL: "https://x/a", SHA256: d, Path: "../a"}} }, "relative"},
		{"artifact url", func(s *Spec) { s.Artifacts = []Artifact{{URL: "file:///etc/passwd", SHA256: d, Path: "a"}} }, "url"},
		{"negative timeout", func(s *Spec) { s.TimeoutSeconds = -1 }, "positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok()
			tt.mutate(&s)
			err := s.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestReportTail(t *testing.T) {
	r := Report{OutputTail: strings.Repeat("a", MaxTailBytes) + "END"}
	got, err := DecodeReport(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.OutputTail) != MaxTailBytes || !strings.HasSuffix(got.OutputTail, "END") {
		t.Errorf("tail is %d bytes ending %q", len(got.OutputTail), got.OutputTail[len(got.OutputTail)-3:])
	}
}

func ptr[T any](v T) *T { return &v }
