package broker

import (
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWriteMosquittoWritesACRL: the config names crl.pem, which holds a
// CRL of the CA revoking nothing until drover mqtt crl rewrites it
// (without a CRL for its CA, Mosquitto would refuse every certificate).
func TestWriteMosquittoWritesACRL(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	conf, err := WriteMosquitto(ca, MosquittoConfig{Dir: dir, Listen: "127.0.0.1:8883"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if want := "crlfile " + filepath.Join(dir, CRLFile) + "\n"; !strings.Contains(string(b), want) {
		t.Errorf("mosquitto.conf lacks %q", want)
	}
	crl, err := ReadCRL(dir)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(crl)
	if blk == nil {
		t.Fatalf("%s holds no PEM: %q", CRLFile, crl)
	}
	l, err := x509.ParseRevocationList(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.CheckSignatureFrom(ca.Cert); err != nil || len(l.RevokedCertificateEntries) != 0 || !l.NextUpdate.After(time.Now()) {
		t.Errorf("CRL signed: %v, %d entries, next update %v; want an empty current CRL of the CA", err, len(l.RevokedCertificateEntries), l.NextUpdate)
	}
}

// TestWriteCRL: the file is replaced whole, readable by the broker's
// user, with nothing left beside it.
func TestWriteCRL(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	for i, serial := range []int64{1, 2} {
		crl, err := ca.SignCRL([]x509.RevocationListEntry{{SerialNumber: big.NewInt(serial), RevocationTime: time.Now()}}, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteCRL(dir, crl); err != nil {
			t.Fatal(err)
		}
		got, err := ReadCRL(dir)
		if err != nil || string(got) != string(crl) {
			t.Fatalf("write %d: read back %v, want what was written", i, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != CRLFile {
		t.Errorf("dir holds %v, want %s alone", entries, CRLFile)
	}
	if st, err := os.Stat(filepath.Join(dir, CRLFile)); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("%s: %v, %v; want mode 0644", CRLFile, st.Mode(), err)
	}
	if got, err := ReadCRL(t.TempDir()); got != nil || err != nil {
		t.Errorf("ReadCRL of a dir without one = %q, %v; want nothing", got, err)
	}
}

// TestReloadMosquittoSignalsOnlyMosquitto: a PID file naming another
// process (here this test's: SIGHUP would end it) is refused.
func TestReloadMosquittoSignalsOnlyMosquitto(t *testing.T) {
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "mosquitto.pid")
	for _, tc := range []struct{ content, want string }{
		{strconv.Itoa(os.Getpid()) + "\n", "not mosquitto"},
		{"garbage", "not a PID"},
		{"1", "not a PID"},
	} {
		if err := os.WriteFile(pidfile, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReloadMosquitto(pidfile); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReloadMosquitto with %q = %v, want an error saying %q", tc.content, err, tc.want)
		}
	}
	if _, err := ReloadMosquitto(filepath.Join(dir, "none")); err == nil {
		t.Error("ReloadMosquitto without a PID file: no error")
	}
}
