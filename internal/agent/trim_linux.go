package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// madvDontneed is MADV_DONTNEED: unmap these pages from this process. On
// a private, never written file mapping (the binary's text and rodata) the
// pages stay in the page cache and the next touch maps them back with a
// minor fault, from the same file.
//
// MADV_PAGEOUT (used before) was weaker and dearer: the kernel skips pages
// another process maps too (the agent's own log shims run this binary), and
// what it does reclaim leaves the page cache, to be read from disk again.
const madvDontneed = 4

// trimBinaryPages unmaps the pages of the agent's own binary that it holds
// mapped. Start-up and package init touch much of a 20 MB binary's code and
// data, and the kernel maps up to 64 KiB around every page fault, while an
// idle agent uses a small part of it: after a trim what comes back is what
// is still used.
// It returns how many bytes it advised.
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
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvDontneed); errno == 0 {
			total += int(end - start)
		}
	}
	return total
}
