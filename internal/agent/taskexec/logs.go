package taskexec

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"unicode/utf8"
)

// rotate copies name to name.1 and empties it once it has max bytes or
// more (copy-truncate: the process keeps its O_APPEND descriptor).
//
// name.1 is the whole old file, as a renamed file would be, so a reader
// that followed name to offset o and then finds it shorter than o goes on
// at offset o of name.1, then from the start of name. Hence the order: the
// copy goes to a temporary file renamed over name.1 (a reader never sees
// half of one), and only then is name truncated, so name.1 is already the
// new one when a reader sees name shrink. What the process writes between
// the end of the copy and the truncation (microseconds) is lost.
func rotate(name string, max int64) error {
	fi, err := os.Stat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Size() < max {
		return nil
	}
	src, err := os.Open(name)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := name + ".1.tmp"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	// Copy to the current end, including what was written since the Stat
	// (the closer the truncation follows, the less output is lost), but
	// bounded: a fast writer must not keep the copy going for ever.
	_, err = io.Copy(dst, io.LimitReader(src, fi.Size()+max))
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name+".1")
	}
	if err == nil {
		err = os.Truncate(name, 0)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rotate %s: %w", name, err)
	}
	return nil
}

// outputTail is the end of stdout then the end of stderr, at most max bytes
// in all; each gets half unless the other needs less.
func outputTail(dir string, max int) string {
	out := readTail(dir+"/"+StdoutFile, max)
	errs := readTail(dir+"/"+StderrFile, max)
	if len(out)+len(errs) > max {
		half := max / 2
		switch {
		case len(out) <= half:
			errs = errs[len(errs)-(max-len(out)):]
		case len(errs) <= half:
			out = out[len(out)-(max-len(errs)):]
		default:
			out, errs = out[len(out)-half:], errs[len(errs)-(max-half):]
		}
	}
	return trimRune(out) + trimRune(errs)
}

// readTail is the last n bytes of name, with the end of name.1 before it
// when name holds fewer (it was just rotated).
func readTail(name string, n int) []byte {
	b := lastBytes(name, n)
	if len(b) < n {
		b = append(lastBytes(name+".1", n-len(b)), b...)
	}
	return b
}

func lastBytes(name string, n int) []byte {
	f, err := os.Open(name)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(fi.Size()-int64(n), 0)
	b := make([]byte, fi.Size()-off)
	k, _ := f.ReadAt(b, off)
	return b[:k]
}

// trimRune drops the bytes of a rune cut at the start of b.
func trimRune(b []byte) string {
	for i := 0; i < len(b) && i < utf8.UTFMax; i++ {
		if utf8.RuneStart(b[i]) {
			return string(b[i:])
		}
	}
	return string(b)
}
