package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Options configure a Manager.
type Options struct {
	// Parent is where attempts' cgroups are created: a path from the root
	// of each hierarchy ("/drover" or "system.slice/drover-tasks").
	// Default: a "drover" child of the agent's own cgroup in each hierarchy.
	Parent string
	// Logger for operators. Default: discard.
	Logger *slog.Logger
}

// Manager creates attempts' cgroups. It is safe for concurrent use.
type Manager struct {
	mode string
	log  *slog.Logger
	// v2 is the parent dir on a v2 manager.
	v2 string
	// v1 maps a controller (memory, cpu, cpuacct, pids, freezer) to its
	// parent dir on a v1 or hybrid manager.
	v1 map[string]string
}

// mount is a cgroup hierarchy mounted on this machine.
type mount struct {
	point string // where it is mounted
	root  string // the hierarchy path the mount shows at point
}

// v1Controllers are the v1 controllers the manager uses; the first three
// are required.
var v1Controllers = []string{"memory", "cpu", "freezer", "cpuacct", "pids"}

// New finds the cgroup hierarchies, creates the parent and returns a
// Manager. Its error wraps ErrUnavailable when the node cannot contain
// attempts.
func New(opts Options) (*Manager, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Parent != "" {
		clean := filepath.Clean("/" + opts.Parent)
		if clean != "/"+strings.Trim(opts.Parent, "/") || strings.Contains(opts.Parent, "..") {
			return nil, fmt.Errorf("cgroup parent %q: want a clean path from the hierarchy root, without ..", opts.Parent)
		}
		opts.Parent = clean
	}
	v1, v2, err := mounts()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if v2 != nil {
		ctrl, _ := os.ReadFile(filepath.Join(v2.point, "cgroup.controllers"))
		f := strings.Fields(string(ctrl))
		if slices.Contains(f, "memory") && slices.Contains(f, "cpu") {
			m := &Manager{mode: ModeV2, log: log}
			if m.v2, err = setupV2(*v2, own[""], opts.Parent, f); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			return m, nil
		}
	}
	m := &Manager{mode: ModeV1, log: log, v1: map[string]string{}}
	if v2 != nil {
		m.mode = ModeHybrid
	}
	for _, c := range v1Controllers {
		mt, ok := v1[c]
		if !ok {
			if c == "cpuacct" || c == "pids" {
				continue
			}
			return nil, fmt.Errorf("%w: no cgroup v2 with the memory and cpu controllers, and no cgroup v1 %s controller mounted", ErrUnavailable, c)
		}
		dir := parentDir(mt, own[c], opts.Parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("%w: create %s: %w", ErrUnavailable, dir, err)
		}
		m.v1[c] = dir
	}
	return m, nil
}

// Mode is ModeV2, ModeV1 or ModeHybrid.
func (m *Manager) Mode() string { return m.mode }

// Parents are the dirs the attempts' cgroups are created in.
func (m *Manager) Parents() []string {
	if m.v2 != "" {
		return []string{m.v2}
	}
	var out []string
	for _, c := range v1Controllers {
		if d, ok := m.v1[c]; ok {
			out = append(out, d)
		}
	}
	return out
}

// parentDir is the dir of parent (or of own/drover) in the hierarchy mt.
func parentDir(mt mount, own, parent string) string {
	if parent != "" {
		return filepath.Join(mt.point, parent)
	}
	rel, err := filepath.Rel(mt.root, own)
	if err != nil || strings.HasPrefix(rel, "..") {
		rel = "" // the agent's cgroup is outside what is mounted (a container): use the mount's root
	}
	return filepath.Join(mt.point, rel, "drover")
}

// setupV2 creates the v2 parent and delegates the controllers down to it.
func setupV2(mt mount, own, parent string, available []string) (string, error) {
	dir := parentDir(mt, own, parent)
	var enable []string
	for _, c := range []string{"memory", "cpu", "pids"} {
		if slices.Contains(available, c) {
			enable = append(enable, "+"+c)
		}
	}
	rel, err := filepath.Rel(mt.point, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("cgroup parent %s is outside the cgroup2 mount %s", dir, mt.point)
	}
	// Every ancestor of an attempt's cgroup, up to its parent, must hand
	// the controllers down.
	cur := mt.point
	for _, part := range append([]string{""}, strings.Split(rel, "/")...) {
		if part != "" {
			cur = filepath.Join(cur, part)
			if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return "", fmt.Errorf("create %s: %w", cur, err)
			}
		}
		err := writeFile(filepath.Join(cur, "cgroup.subtree_control"), strings.Join(enable, " "))
		if errors.Is(err, syscall.EBUSY) && cur != mt.point {
			// No internal processes: a cgroup that hands controllers down
			// holds no process itself. Move the agent (and whatever shares
			// its cgroup) into a leaf, as a systemd unit with Delegate=yes
			// is expected to.
			if err = evacuate(cur); err == nil {
				err = writeFile(filepath.Join(cur, "cgroup.subtree_control"), strings.Join(enable, " "))
			}
		}
		if err != nil {
			return "", fmt.Errorf("enable %s in %s: %w", strings.Join(enable, " "), cur, err)
		}
	}
	return dir, nil
}

// evacuate moves the processes of dir into its "agent" leaf.
func evacuate(dir string) error {
	leaf := filepath.Join(dir, "agent")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	pids, err := readPids(dir)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := writeFile(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(pid)); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("move pid %d to %s: %w", pid, leaf, err)
		}
	}
	return nil
}

// mounts reads /proc/self/mountinfo: the v1 hierarchy of each controller,
// and the cgroup2 mount (nil if none).
func mounts() (map[string]mount, *mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	v1 := map[string]mount{}
	var v2 *mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root point opts [optional...] - fstype source superopts
		before, after, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		bf, af := strings.Fields(before), strings.Fields(after)
		if len(bf) < 5 || len(af) < 3 {
			continue
		}
		mt := mount{point: unescape(bf[4]), root: unescape(bf[3])}
		switch af[0] {
		case "cgroup2":
			if v2 == nil {
				v2 = &mt
			}
		case "cgroup":
			for o := range strings.SplitSeq(af[2], ",") {
				if _, seen := v1[o]; !seen {
					v1[o] = mt
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	if len(v1) == 0 && v2 == nil {
		return nil, nil, errors.New("no cgroup filesystem is mounted")
	}
	return v1, v2, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroups reads /proc/self/cgroup: the agent's cgroup path per v1
// controller, and under "" its v2 path.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			own[""] = parts[2]
			continue
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own, nil
}

// Create creates the cgroup of attempt name with its limits. A cgroup left
// by an earlier try of the same attempt is killed and reused.
func (m *Manager) Create(name string, lim Limits) (*Group, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	g := &Group{log: m.log}
	if m.v2 != "" {
		g.v2 = filepath.Join(m.v2, name)
	} else {
		g.v1 = map[string]string{}
		for c, d := range m.v1 {
			g.v1[c] = filepath.Join(d, name)
		}
	}
	for _, d := range g.Dirs() {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			g.Remove()
			return nil, fmt.Errorf("create cgroup %s: %w", d, err)
		}
	}
	if err := g.Kill(); err != nil { // an earlier try's leftovers
		return nil, err
	}
	if err := g.limit(lim); err != nil {
		g.Remove()
		return nil, err
	}
	return g, nil
}

// Open finds an attempt's cgroup again from its Dirs, after a restart.
func Open(dirs []string, log *slog.Logger) (*Group, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(dirs) == 0 {
		return nil, errors.New("no cgroup dirs")
	}
	g := &Group{log: log}
	for _, d := range dirs {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d {
			return nil, fmt.Errorf("cgroup dir %q is not a clean absolute path", d)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil {
			return nil, fmt.Errorf("cgroup dir %s: %w", d, err)
		}
		switch st.Type {
		case unix.CGROUP2_SUPER_MAGIC:
			if len(dirs) != 1 {
				return nil, fmt.Errorf("cgroup dirs %q: a v2 cgroup is one dir", dirs)
			}
			g.v2 = d
		case unix.CGROUP_SUPER_MAGIC:
			if g.v1 == nil {
				g.v1 = map[string]string{}
			}
			for _, c := range v1Controllers {
				if _, err := os.Stat(filepath.Join(d, c+v1Probe[c])); err == nil {
					g.v1[c] = d
				}
			}
		default:
			return nil, fmt.Errorf("cgroup dir %s is not on a cgroup filesystem", d)
		}
	}
	return g, nil
}

// v1Probe is a file that only a controller's v1 dirs have.
var v1Probe = map[string]string{"memory": ".limit_in_bytes", "cpu": ".cfs_quota_us", "freezer": ".state", "cpuacct": ".usage", "pids": ".max"}

// readPids reads dir/cgroup.procs.
func readPids(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for f := range bytes.FieldsSeq(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// writeFile writes a cgroup file (they exist; one write is one command).
func writeFile(name, value string) error {
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, name, err)
	}
	return nil
}
