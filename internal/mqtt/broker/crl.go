package broker

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/drover-fleet/drover/internal/pki"
)

// CRLFile is the CRL file in a Mosquitto config directory (its crlfile).
const CRLFile = "crl.pem"

// MosquittoCAs are the CAs the Mosquitto of dir trusts (its ca.crt): each
// needs a CRL in CRLFile, or the broker refuses its certificates.
func MosquittoCAs(dir string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read the broker's CAs (written by drover mqtt mosquitto-config): %w", err)
	}
	cas, err := pki.ParseCerts(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "ca.crt"), err)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("%s holds no certificate", filepath.Join(dir, "ca.crt"))
	}
	return cas, nil
}

// ReadCRL returns dir's CRLFile; nil when there is none.
func ReadCRL(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, CRLFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// WriteCRL replaces dir's CRLFile with crlPEM at once (a new file renamed
// over it): Mosquitto, reading it on SIGHUP, sees the old file or the new
// one, never part of one.
func WriteCRL(dir string, crlPEM []byte) error {
	f, err := os.CreateTemp(dir, "."+CRLFile+"-*")
	if err != nil {
		return fmt.Errorf("write the CRL: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // gone after the rename; there after a failure
	if _, err := f.Write(crlPEM); err != nil {
		f.Close()
		return fmt.Errorf("write the CRL: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("write the CRL: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write the CRL: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write the CRL: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, CRLFile)); err != nil {
		return fmt.Errorf("write the CRL: %w", err)
	}
	return nil
}

// ReloadMosquitto sends SIGHUP to the Mosquitto whose PID pidfile holds
// (its pid_file option, /run/mosquitto/mosquitto.pid under Debian's
// systemd unit): Mosquitto 2.0 then reads its CRL file again, and new
// connections are checked against it. Connections already open stay.
//
// The PID must name a process called mosquitto: a stale file naming
// another process must not have it signalled (SIGHUP ends most).
func ReloadMosquitto(pidfile string) (pid int, err error) {
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return 0, fmt.Errorf("read Mosquitto's PID: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s holds %q, not a PID", pidfile, clip(string(b)))
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return pid, fmt.Errorf("process %d of %s: %w (is Mosquitto running?)", pid, pidfile, err)
	}
	if name := string(bytes.TrimSpace(comm)); name != "mosquitto" {
		return pid, fmt.Errorf("process %d of %s is %q, not mosquitto: not signalling it (stale PID file?)", pid, pidfile, name)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return pid, fmt.Errorf("signal Mosquitto (PID %d) to reload its CRL: %w", pid, err)
	}
	return pid, nil
}

// clip is s as an error may quote it: at most 32 bytes.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
