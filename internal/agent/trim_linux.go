package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// madvPageout is MADV_PAGEOUT (Linux 5.4+): reclaim these pages now.
const madvPageout = 21

// trimBinaryPages lets the kernel drop the pages of the agent's own binary
// that only start-up touched. The Go runtime walks the whole function table
// when it starts, which leaves most of a 20 MB binary resident although an
// idle agent runs a small part of it; clean file pages come back from the
// page cache if they are needed again. It returns how many bytes it advised.
func trimBinaryPages() int {
	exe, err := os.Executable()
	if err != nil {
		return 0
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0
	}
	defer f.Close()
	total := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// address perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue // only read-only mappings of the binary: text and rodata
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		// The raw call: the range is not Go memory, so it is never a slice.
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvPageout); errno == 0 {
			total += int(end - start)
		}
	}
	return total
}
