// Package checks runs a node job's pre-checks (KubeEdge's Check action):
// CPU usage, memory usage and disk usage against percent limits. It reads
// /proc and statfs directly and imports nothing from k8s.io, because
// drover-agent links it.
package checks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// Default limits in percent, used when a job leaves one at 0.
const (
	DefaultCPUPercent  = 80
	DefaultMemPercent  = 80
	DefaultDiskPercent = 90
)

// DefaultCPUInterval is how long CPU usage is sampled: long enough to average
// out a burst, short enough not to hold up the nodejobwire.
const DefaultCPUInterval = time.Second

// Checker measures. The zero value reads /proc and samples CPU for
// DefaultCPUInterval.
type Checker struct {
	// ProcDir is the proc filesystem; default "/proc". Tests point it at
	// testdata.
	ProcDir string
	// CPUInterval is the time between the two /proc/stat samples.
	CPUInterval time.Duration
	// Clock times the CPU window; default clock.Real().
	Clock clock.Clock
	// Statfs measures a directory's file system; default statfs(2).
	Statfs func(dir string) (DiskStat, error)
}

// Check runs c's items with the default Checker.
func Check(ctx context.Context, c nodejobwire.Checks, dir string) error {
	return Checker{}.Check(ctx, c, dir)
}

// Check runs each item of c ("cpu", "mem", "disk": disk is dir's file
// system) and returns nil when all are under their limits, or an error
// naming every item that failed with its measured value, e.g.
// "check cpu: usage 93.1% is over the limit 80%".
func (k Checker) Check(ctx context.Context, c nodejobwire.Checks, dir string) error {
	if k.ProcDir == "" {
		k.ProcDir = "/proc"
	}
	if k.CPUInterval <= 0 {
		k.CPUInterval = DefaultCPUInterval
	}
	if k.Statfs == nil {
		k.Statfs = statfs
	}
	k.Clock = clock.Or(k.Clock)
	var errs []error
	for _, item := range c.Items {
		var (
			used  float64
			limit int
			err   error
		)
		switch item {
		case "cpu":
			limit = orDefault(c.CPUPercent, DefaultCPUPercent)
			used, err = k.cpu(ctx)
		case "mem":
			limit = orDefault(c.MemPercent, DefaultMemPercent)
			used, err = k.mem()
		case "disk":
			limit = orDefault(c.DiskPercent, DefaultDiskPercent)
			var st DiskStat
			if st, err = k.Statfs(dir); err == nil {
				used, err = st.UsedPercent()
			}
		default:
			err = fmt.Errorf("unknown check item %q", item)
		}
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("check %s: %w", item, err))
		case used > float64(limit):
			errs = append(errs, fmt.Errorf("check %s: usage %.1f%% is over the limit %d%%", item, used, limit))
		}
	}
	return errors.Join(errs...)
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// cpu samples /proc/stat twice, CPUInterval apart.
func (k Checker) cpu(ctx context.Context) (float64, error) {
	a, err := k.readCPU()
	if err != nil {
		return 0, err
	}
	t := k.Clock.NewTimer(k.CPUInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-t.Chan():
	}
	b, err := k.readCPU()
	if err != nil {
		return 0, err
	}
	return CPUUsedPercent(a, b)
}

func (k Checker) readCPU() (CPUSample, error) {
	f, err := os.Open(filepath.Join(k.ProcDir, "stat"))
	if err != nil {
		return CPUSample{}, err
	}
	defer f.Close()
	return ParseProcStat(f)
}

func (k Checker) mem() (float64, error) {
	f, err := os.Open(filepath.Join(k.ProcDir, "meminfo"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	m, err := ParseMemInfo(f)
	if err != nil {
		return 0, err
	}
	return m.UsedPercent(), nil
}

// CPUSample is the aggregate "cpu" line of /proc/stat, in clock ticks.
type CPUSample struct {
	// Idle counts idle and iowait time.
	Idle uint64
	// Total counts every column (guest time is already in user and nice).
	Total uint64
}

// ParseProcStat reads the aggregate "cpu" line of /proc/stat.
func ParseProcStat(r io.Reader) (CPUSample, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "cpu" {
			continue
		}
		if len(fields) < 5 {
			return CPUSample{}, fmt.Errorf("/proc/stat: cpu line has %d columns, want at least 4", len(fields)-1)
		}
		var s CPUSample
		for i, f := range fields[1:] {
			if i >= 8 {
				break // guest and guest_nice are counted in user and nice
			}
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return CPUSample{}, fmt.Errorf("/proc/stat: cpu column %d: %w", i+1, err)
			}
			s.Total += v
			if i == 3 || i == 4 { // idle, iowait
				s.Idle += v
			}
		}
		return s, nil
	}
	if err := sc.Err(); err != nil {
		return CPUSample{}, fmt.Errorf("/proc/stat: %w", err)
	}
	return CPUSample{}, errors.New("/proc/stat: no cpu line")
}

// CPUUsedPercent is the busy share of the time between samples a and b.
func CPUUsedPercent(a, b CPUSample) (float64, error) {
	if b.Total <= a.Total || b.Idle < a.Idle {
		return 0, errors.New("/proc/stat: the cpu counters did not advance")
	}
	total := float64(b.Total - a.Total)
	idle := float64(b.Idle - a.Idle)
	if idle > total {
		idle = total
	}
	return 100 * (total - idle) / total, nil
}

// MemInfo is what the mem check needs from /proc/meminfo, in kB.
type MemInfo struct {
	Total, Available uint64
}

// ParseMemInfo reads MemTotal and MemAvailable from /proc/meminfo.
func ParseMemInfo(r io.Reader) (MemInfo, error) {
	var (
		m                  MemInfo
		haveTotal, haveAvl bool
	)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "MemTotal" && key != "MemAvailable") {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return MemInfo{}, fmt.Errorf("/proc/meminfo: %s has no value", key)
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return MemInfo{}, fmt.Errorf("/proc/meminfo: %s: %w", key, err)
		}
		if key == "MemTotal" {
			m.Total, haveTotal = v, true
		} else {
			m.Available, haveAvl = v, true
		}
	}
	if err := sc.Err(); err != nil {
		return MemInfo{}, fmt.Errorf("/proc/meminfo: %w", err)
	}
	switch {
	case !haveTotal:
		return MemInfo{}, errors.New("/proc/meminfo: no MemTotal")
	case !haveAvl:
		// Kernels before 3.14 lack MemAvailable; guessing from MemFree
		// would understate what is free, so say so instead.
		return MemInfo{}, errors.New("/proc/meminfo: no MemAvailable (kernel older than 3.14)")
	case m.Total == 0 || m.Available > m.Total:
		return MemInfo{}, fmt.Errorf("/proc/meminfo: MemAvailable %d kB of MemTotal %d kB", m.Available, m.Total)
	}
	return m, nil
}

// UsedPercent is the share of memory not available.
func (m MemInfo) UsedPercent() float64 {
	return 100 * float64(m.Total-m.Available) / float64(m.Total)
}

// DiskStat is what the disk check needs from statfs, in blocks.
type DiskStat struct {
	Blocks, Free, Avail uint64
}

// UsedPercent is used/(used+available), as df computes it: blocks reserved
// for root count as neither.
func (d DiskStat) UsedPercent() (float64, error) {
	if d.Blocks == 0 || d.Free > d.Blocks || d.Avail > d.Free {
		return 0, fmt.Errorf("statfs: %d blocks, %d free, %d available", d.Blocks, d.Free, d.Avail)
	}
	used := d.Blocks - d.Free
	if used+d.Avail == 0 {
		return 0, nil
	}
	return 100 * float64(used) / float64(used+d.Avail), nil
}
