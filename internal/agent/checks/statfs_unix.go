//go:build linux || darwin || freebsd || netbsd || openbsd

package checks

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func statfs(dir string) (DiskStat, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return DiskStat{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return DiskStat{Blocks: uint64(st.Blocks), Free: uint64(st.Bfree), Avail: uint64(st.Bavail)}, nil
}
