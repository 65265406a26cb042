package fleetnode

import (
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Info is what an agent reports of its machine, already validated by the
// hub (which converts it from the protocol's NodeInfo).
type Info struct {
	AgentVersion, OS, Arch, Hostname string
	// Capacity replaces the node's when not empty.
	Capacity corev1.ResourceList
	// Labels are all the agent's labels: none means none.
	Labels map[string]string
}

// SetReported copies what the agent reported into n's status; it reports
// whether anything changed. A nil info changes nothing. The hub writes it
// at registration, on connect and with every NodeState.
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
	if len(info.Capacity) > 0 && !capacityEqual(n.Status.Capacity, info.Capacity) {
		n.Status.Capacity, changed = info.Capacity.DeepCopy(), true
	}
	if !maps.Equal(n.Status.ReportedLabels, info.Labels) {
		n.Status.ReportedLabels, changed = maps.Clone(info.Labels), true
	}
	return changed
}

// SetCertificateExpiry records when the client certificate the hub just
// signed for n expires.
func SetCertificateExpiry(n *fleetv1.FleetNode, notAfter time.Time) bool {
	t := stamp(notAfter)
	if n.Status.CertificateExpiry.Equal(t) {
		return false
	}
	n.Status.CertificateExpiry = t
	return true
}

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
