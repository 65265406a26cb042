package fleetnode

import (
	"crypto/x509"
	"maps"
	"math/big"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Info is what an agent reports of its machine, already validated by the
// hub (which converts it from the protocol's NodeInfo).
type Info struct {
	AgentVersion, OS, Arch, Hostname string
	// Capacity replaces the node's reported capacity when not empty.
	Capacity corev1.ResourceList
	// Labels are all the agent's labels: none means none.
	Labels map[string]string
}

// NodeLabels are the labels info asks the node to carry: the agent's, with
// fleet.drover.io/os, /arch and /hostname taken from the facts it reports
// (an agent label with one of those keys is dropped). A fact that is not a
// valid label value gives no label.
func (i *Info) NodeLabels() map[string]string {
	return nodeLabels(i.Labels, i.OS, i.Arch, i.Hostname)
}

func nodeLabels(agent map[string]string, os, arch, hostname string) map[string]string {
	out := map[string]string{}
	for k, v := range agent {
		if !reservedLabel(k) {
			out[k] = v
		}
	}
	for k, v := range map[string]string{fleetv1.LabelOS: os, fleetv1.LabelArch: arch, fleetv1.LabelHostname: hostname} {
		if v != "" && len(validation.IsValidLabelValue(v)) == 0 {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// reservedLabel reports whether key is a label Drover derives from the
// facts the agent reports rather than from its labels.
func reservedLabel(key string) bool {
	return key == fleetv1.LabelOS || key == fleetv1.LabelArch || key == fleetv1.LabelHostname
}

// SetReported copies what the agent reported into n's status; it reports
// whether anything changed. A nil info changes nothing. The hub writes it
// at registration, on connect and with every NodeState. Labels and
// capacity are claims: they land in reportedLabels and reportedCapacity,
// which the manager holds against what was approved.
func SetReported(n *fleetv1.FleetNode, info *Info) bool {
	if info == nil {
		return false
	}
	changed := false
	set := func(dst *string, v string) {
		if v != "" && *dst != v {
			*dst, changed = v, true
		}
	}
	set(&n.Status.AgentVersion, info.AgentVersion)
	set(&n.Status.OS, info.OS)
	set(&n.Status.Arch, info.Arch)
	set(&n.Status.Hostname, info.Hostname)
	if len(info.Capacity) > 0 && !capacityEqual(n.Status.ReportedCapacity, info.Capacity) {
		n.Status.ReportedCapacity, changed = info.Capacity.DeepCopy(), true
	}
	// The facts fill in the reserved keys as the node has them now: a
	// NodeState that leaves one out keeps it.
	s := &n.Status
	if l := nodeLabels(info.Labels, s.OS, s.Arch, s.Hostname); !maps.Equal(s.ReportedLabels, l) {
		s.ReportedLabels, changed = l, true
	}
	return changed
}

// MaxCertificates bounds status.certificates. Agents renew at two thirds
// of a certificate's lifetime, so about two are unexpired at once; the
// rest is room for retries.
const MaxCertificates = 4

// SetCertificate records the client certificate the hub just signed for n:
// its expiry (status.certificateExpiry) and,
// in status.certificates, its serial and issuer beside the others that may
// still be valid. Certificates expired before cert was signed go, and past
// MaxCertificates those that expire first. It reports whether anything
// changed; the hub writes it in the status write of the signing.
func SetCertificate(n *fleetv1.FleetNode, cert *x509.Certificate) bool {
	changed := false
	if t := stamp(cert.NotAfter); !n.Status.CertificateExpiry.Equal(t) {
		n.Status.CertificateExpiry, changed = t, true
	}
	serial := SerialHex(cert.SerialNumber)
	certs := slices.DeleteFunc(slices.Clone(n.Status.Certificates), func(c fleetv1.NodeCertificate) bool {
		return !c.NotAfter.After(cert.NotBefore) || c.Serial == serial
	})
	certs = append(certs, fleetv1.NodeCertificate{Serial: serial, Issuer: cert.Issuer.CommonName, NotAfter: *stamp(cert.NotAfter)})
	if len(certs) > MaxCertificates {
		// The newest stays last; of the others, those expiring last stay.
		rest := certs[:len(certs)-1]
		slices.SortStableFunc(rest, func(a, b fleetv1.NodeCertificate) int { return b.NotAfter.Compare(a.NotAfter.Time) })
		certs = append(rest[:MaxCertificates-1], certs[len(certs)-1])
	}
	if !slices.EqualFunc(certs, n.Status.Certificates, func(a, b fleetv1.NodeCertificate) bool {
		return a.Serial == b.Serial && a.Issuer == b.Issuer && a.NotAfter.Equal(&b.NotAfter)
	}) {
		n.Status.Certificates, changed = certs, true
	}
	return changed
}

// SerialHex is how a certificate serial is recorded: lowercase hex.
func SerialHex(serial *big.Int) string { return serial.Text(16) }

func capacityEqual(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, q := range a {
		if r, ok := b[k]; !ok || q.Cmp(r) != 0 {
			return false
		}
	}
	return true
}
