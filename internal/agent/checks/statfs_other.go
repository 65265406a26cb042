//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package checks

import (
	"fmt"
	"runtime"
)

func statfs(dir string) (DiskStat, error) {
	return DiskStat{}, fmt.Errorf("statfs %s: not supported on %s", dir, runtime.GOOS)
}
