package checks

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

func near(a, b float64) bool { return math.Abs(a-b) < 0.05 }

func TestParseProcStat(t *testing.T) {
	tests := []struct {
		file string
		want CPUSample
		err  string
	}{
		{"stat-linux6", CPUSample{Idle: 225880 + 3326, Total: 336478 + 141059 + 225880 + 3326 + 7432}, ""},
		{"stat-old4cols", CPUSample{Idle: 850, Total: 1000}, ""},
		{"stat-nocpu", CPUSample{}, "no cpu line"},
		{"stat-garbage", CPUSample{}, "cpu column 2"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := ParseProcStat(f)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseProcStat() = %v, %v; want an error containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseProcStat() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestCPUUsedPercent(t *testing.T) {
	tests := []struct {
		name string
		a, b CPUSample
		want float64
		err  bool
	}{
		{"a quarter busy", CPUSample{Idle: 100, Total: 200}, CPUSample{Idle: 175, Total: 300}, 25, false},
		{"all busy", CPUSample{Idle: 100, Total: 200}, CPUSample{Idle: 100, Total: 300}, 100, false},
		{"no ticks between samples", CPUSample{Idle: 100, Total: 200}, CPUSample{Idle: 100, Total: 200}, 0, true},
		{"counters went back", CPUSample{Idle: 100, Total: 200}, CPUSample{Idle: 90, Total: 300}, 0, true},
	}
	for _, tt := range tests {
		got, err := CPUUsedPercent(tt.a, tt.b)
		if (err != nil) != tt.err || !near(got, tt.want) {
			t.Errorf("%s: CPUUsedPercent() = %v, %v; want %v (error %v)", tt.name, got, err, tt.want, tt.err)
		}
	}
}

func TestParseMemInfo(t *testing.T) {
	tests := []struct {
		file string
		used float64
		err  string
	}{
		{"meminfo-linux6", 100 * float64(24683620-22264252) / 24683620, ""},
		{"meminfo-full", 95, ""},
		{"meminfo-old", 0, "no MemAvailable"},
		{"stat-linux6", 0, "no MemTotal"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m, err := ParseMemInfo(f)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseMemInfo() = %v, %v; want an error containing %q", m, err, tt.err)
				}
				return
			}
			if err != nil || !near(m.UsedPercent(), tt.used) {
				t.Fatalf("ParseMemInfo() = %+v (%.2f%% used), %v; want %.2f%% used", m, m.UsedPercent(), err, tt.used)
			}
		})
	}
}

func TestDiskUsedPercent(t *testing.T) {
	tests := []struct {
		name string
		d    DiskStat
		want float64
		err  bool
	}{
		{"half used, like df", DiskStat{Blocks: 1000, Free: 550, Avail: 450}, 50, false},
		{"empty", DiskStat{Blocks: 1000, Free: 1000, Avail: 1000}, 0, false},
		{"full for users, root reserve left", DiskStat{Blocks: 1000, Free: 50, Avail: 0}, 100, false},
		{"nonsense", DiskStat{Blocks: 0}, 0, true},
	}
	for _, tt := range tests {
		got, err := tt.d.UsedPercent()
		if (err != nil) != tt.err || !near(got, tt.want) {
			t.Errorf("%s: UsedPercent() = %v, %v; want %v (error %v)", tt.name, got, err, tt.want, tt.err)
		}
	}
}

// testCPUInterval keeps the real-/proc CPU sample short.
const testCPUInterval = 50 * time.Millisecond

func TestCheck(t *testing.T) {
	disk := func(d DiskStat) func(string) (DiskStat, error) {
		return func(string) (DiskStat, error) { return d, nil }
	}
	tests := []struct {
		name    string
		k       Checker
		c       nodejobwire.Checks
		wantErr []string // substrings; none means Check passes
	}{
		{"no items checks nothing", Checker{ProcDir: "testdata/nowhere"}, nodejobwire.Checks{}, nil},
		{"memory under the default limit", Checker{ProcDir: "testdata/proc-idle"}, nodejobwire.Checks{Items: []string{"mem"}}, nil},
		{"memory over the default limit names the value", Checker{ProcDir: "testdata/proc-busy"}, nodejobwire.Checks{Items: []string{"mem"}},
			[]string{"check mem: usage 95.0% is over the limit 80%"}},
		{"memory under a raised limit", Checker{ProcDir: "testdata/proc-busy"}, nodejobwire.Checks{Items: []string{"mem"}, MemPercent: 96}, nil},
		{"disk over its limit", Checker{Statfs: disk(DiskStat{Blocks: 100, Free: 5, Avail: 5})}, nodejobwire.Checks{Items: []string{"disk"}},
			[]string{"check disk: usage 95.0% is over the limit 90%"}},
		{"every failure is named", Checker{ProcDir: "testdata/proc-busy", Statfs: disk(DiskStat{Blocks: 100, Free: 5, Avail: 5})},
			nodejobwire.Checks{Items: []string{"mem", "disk"}}, []string{"check mem: usage 95.0%", "check disk: usage 95.0%"}},
		{"cpu counters that do not move are an error", Checker{ProcDir: "testdata/proc-idle", CPUInterval: time.Millisecond},
			nodejobwire.Checks{Items: []string{"cpu"}}, []string{"check cpu: /proc/stat: the cpu counters did not advance"}},
		{"a missing /proc file is an error", Checker{ProcDir: "testdata/nowhere"}, nodejobwire.Checks{Items: []string{"mem"}},
			[]string{"check mem: open testdata/nowhere/meminfo"}},
		{"real cpu under 100%", Checker{CPUInterval: testCPUInterval}, nodejobwire.Checks{Items: []string{"cpu"}, CPUPercent: 100}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.k.Check(context.Background(), tt.c, t.TempDir())
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Check() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check() = nil, want an error containing %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check() = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestCheckRealDisk(t *testing.T) {
	// The real statfs of a temp dir: used percent is within [0, 100], so
	// a limit of 100 passes.
	if err := Check(context.Background(), nodejobwire.Checks{Items: []string{"disk", "mem"}, DiskPercent: 100, MemPercent: 100}, t.TempDir()); err != nil {
		t.Fatalf("Check(disk, mem at 100%%) = %v", err)
	}
}

func TestCheckCPUStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Checker{CPUInterval: time.Hour}.Check(ctx, nodejobwire.Checks{Items: []string{"cpu"}}, "")
	if err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("Check(cancelled) = %v, want context canceled", err)
	}
}
