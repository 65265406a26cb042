package taskexec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// DefaultTaskUser is the user tasks run as when their spec names none.
const DefaultTaskUser = "nobody"

// nobodyID is nobody's uid and gid on most Linux systems, used when the
// system has no user named nobody (a minimal image).
const nobodyID = 65534

// User is a uid and gid a task's process runs as.
type User struct {
	UID uint32
	GID uint32
}

func (u User) String() string { return fmt.Sprintf("%d:%d", u.UID, u.GID) }

// root reports whether u is root's uid or group: what an agent refuses
// without Options.AllowRoot.
func (u User) root() bool { return u.UID == 0 || u.GID == 0 }

// LookupUser resolves drover-agent's --task-user: a user name or a uid
// (with its primary group from the user database, else gid = uid), or
// uid:gid. DefaultTaskUser falls back to 65534:65534 when the system does
// not know it.
func LookupUser(s string) (User, error) {
	if s == "" {
		return User{}, errors.New("task user: empty; want a user name, uid or uid:gid")
	}
	if u, g, ok := strings.Cut(s, ":"); ok {
		uid, err1 := parseID(u)
		gid, err2 := parseID(g)
		if err := errors.Join(err1, err2); err != nil {
			return User{}, fmt.Errorf("task user %q: want uid:gid: %w", s, err)
		}
		return User{UID: uid, GID: gid}, nil
	}
	var (
		pw  *user.User
		err error
	)
	if uid, perr := parseID(s); perr == nil {
		if pw, err = user.LookupId(s); err != nil {
			return User{UID: uid, GID: uid}, nil // a uid the system does not name
		}
	} else if pw, err = user.Lookup(s); err != nil {
		if s == DefaultTaskUser {
			return User{UID: nobodyID, GID: nobodyID}, nil
		}
		return User{}, fmt.Errorf("task user %q: %w", s, err)
	}
	uid, err1 := parseID(pw.Uid)
	gid, err2 := parseID(pw.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return User{}, fmt.Errorf("task user %q: %w", s, err)
	}
	return User{UID: uid, GID: gid}, nil
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > uint64(taskwire.MaxID) {
		return 0, fmt.Errorf("%q is not a uid or gid from 0 to %d", s, taskwire.MaxID)
	}
	return uint32(n), nil
}

// runAs is the user the attempt of spec runs as: its runAsUser and
// runAsGroup, else the task user. Its error says why the agent refuses.
func (d *Driver) runAs(spec *taskwire.Spec) (User, error) {
	if !d.switching {
		// Without root no user can be changed: everything runs as the agent.
		if (spec.RunAsUser != nil && *spec.RunAsUser != int64(d.taskUser.UID)) ||
			(spec.RunAsGroup != nil && *spec.RunAsGroup != int64(d.taskUser.GID)) {
			return User{}, fmt.Errorf("the task asks to run as %s, but this agent runs unprivileged as uid %d (gid %d) "+
				"and cannot switch users: run drover-agent as root, or leave out the task's securityContext", asked(spec), d.taskUser.UID, d.taskUser.GID)
		}
		return d.taskUser, nil
	}
	u := d.taskUser
	if spec.RunAsUser != nil {
		u = User{UID: uint32(*spec.RunAsUser), GID: uint32(*spec.RunAsUser)}
	}
	if spec.RunAsGroup != nil {
		u.GID = uint32(*spec.RunAsGroup)
	}
	if u.root() && !d.opts.AllowRoot {
		return User{}, fmt.Errorf("the task would run as root (uid %d, gid %d) and this agent refuses root tasks "+
			"(drover-agent --allow-root-tasks allows them, where a NodeGrant allows them too)", u.UID, u.GID)
	}
	return u, nil
}

// asked is what spec's securityContext asks for, for messages.
func asked(spec *taskwire.Spec) string {
	var parts []string
	if spec.RunAsUser != nil {
		parts = append(parts, "uid "+strconv.FormatInt(*spec.RunAsUser, 10))
	}
	if spec.RunAsGroup != nil {
		parts = append(parts, "gid "+strconv.FormatInt(*spec.RunAsGroup, 10))
	}
	return strings.Join(parts, ", ")
}

// credential is the SysProcAttr credential of a process run as u: nil when
// the agent cannot switch users. Supplementary groups are cleared (an
// empty list, set), so the task holds none of the agent's.
func (d *Driver) credential(u User) *syscall.Credential {
	if !d.switching {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
}

// chown gives name (not a symlink's target) to u, when the agent can.
func (d *Driver) chown(root *os.Root, name string, u User) error {
	if !d.switching {
		return nil
	}
	return root.Lchown(name, int(u.UID), int(u.GID))
}

// makeAttemptDir creates the attempt's own dir under the work root: 0700
// and u's, so no other user (another task's included) reads it. Only the
// agent can create entries in the work root (0711, the agent's), so what
// it finds there under the attempt's name is its own doing.
func (d *Driver) makeAttemptDir(dir string, u User) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create the attempt's dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("create the attempt's dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("the attempt's dir %s is not a directory", dir)
	}
	if d.switching {
		if err := os.Lchown(dir, int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("give the attempt's dir to %s: %w", u, err)
		}
	}
	return os.Chmod(dir, 0o700)
}

// mkdirOwned creates rel inside root, each part it creates owned by u. A
// part that exists must be a directory inside root (os.Root refuses a
// symlink that leaves it).
func (d *Driver) mkdirOwned(root *os.Root, rel string, u User) error {
	cur := ""
	for seg := range strings.SplitSeq(filepath.Clean(rel), string(filepath.Separator)) {
		if seg == "" || seg == "." {
			continue
		}
		cur = filepath.Join(cur, seg)
		err := root.Mkdir(cur, 0o755)
		if err == nil {
			if err := d.chown(root, cur, u); err != nil {
				return err
			}
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		fi, err := root.Stat(cur)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", cur)
		}
	}
	return nil
}

// workingDir makes the attempt's working dir and returns its path: the
// attempt's dir itself, a relative dir inside it (created, u's, confined
// to it), or an absolute one used as it is (created when missing, and then
// u's).
func (d *Driver) workingDir(attempt, spec string, u User) (string, error) {
	switch {
	case spec == "":
		return attempt, nil
	case filepath.IsAbs(spec):
		if _, err := os.Stat(spec); err == nil {
			return spec, nil
		}
		if err := os.MkdirAll(spec, 0o755); err != nil {
			return "", fmt.Errorf("create working dir %s: %w", spec, err)
		}
		if d.switching {
			if err := os.Lchown(spec, int(u.UID), int(u.GID)); err != nil {
				return "", fmt.Errorf("give working dir %s to %s: %w", spec, u, err)
			}
		}
		return spec, nil
	}
	if !filepath.IsLocal(spec) {
		return "", fmt.Errorf("working dir %q leaves the attempt's dir", spec)
	}
	root, err := os.OpenRoot(attempt)
	if err != nil {
		return "", err
	}
	defer root.Close()
	if err := d.mkdirOwned(root, spec, u); err != nil {
		return "", fmt.Errorf("create working dir %s inside the attempt's dir: %w", spec, err)
	}
	return filepath.Join(attempt, spec), nil
}

// reachable checks that u may search every dir above dir. A work root
// under a private dir (a home, a 0700 data dir) would fail each task with
// a bare "permission denied"; this says why, and what to change.
func reachable(dir string, u User) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		m := fi.Mode().Perm()
		ok := m&0o001 != 0
		if st, isUnix := fi.Sys().(*syscall.Stat_t); isUnix && !ok {
			ok = (st.Uid == u.UID && m&0o100 != 0) || (st.Gid == u.GID && m&0o010 != 0)
		}
		if !ok {
			return fmt.Errorf("the task's user %s cannot reach its dir %s: %s (mode %o) does not let it through; "+
				"give drover-agent a --work-dir whose parents every user may search (e.g. /var/lib/drover-agent-work)", u, dir, p, m)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}
