package agent

import (
	"fmt"
	"regexp"
	"strings"
)

// The hub refuses a node whose capacity it cannot read (a name that is not
// a Kubernetes qualified name, a value that is not a resource quantity):
// registration and connect fail. ParseCapacity checks the same rules here,
// without k8s.io, so that a bad --capacity stops the agent at start with a
// clear message instead.
var (
	// quantityRE is resource.ParseQuantity's grammar without a sign: a
	// decimal number, then a binary (Ki…Ei) or decimal (n, u, m, k, M…E)
	// suffix or an exponent (e3, E-2).
	quantityRE = regexp.MustCompile(`^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$`)
	// nameRE is a qualified name's name part: 63 characters at most,
	// alphanumeric at both ends, '-', '_' and '.' between.
	nameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	// dnsLabelRE is one label of a DNS subdomain (a qualified name's prefix).
	dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// ParseCapacity parses --capacity: name=quantity pairs separated by commas,
// e.g. "gpu=1,example.com/fpga=2,memory=8Gi". Quantities are non-negative
// Kubernetes quantities (1, 0.5, 500m, 8Gi, 1e3). Empty input is nil.
func ParseCapacity(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want name=quantity pairs separated by commas, e.g. gpu=1,memory=8Gi", kv)
		}
		if err := checkResourceName(k); err != nil {
			return nil, fmt.Errorf("%q: name %v", kv, err)
		}
		if !quantityRE.MatchString(v) {
			return nil, fmt.Errorf("%q: quantity %q: want a non-negative number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei; m, k, M, G, T, P, E; or e3), e.g. 1, 500m, 8Gi", kv, v)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%q: %s given twice", kv, k)
		}
		out[k] = v
	}
	return out, nil
}

// standardResources are the resource names tasks may use without a
// prefix (as the API's admission policy checks them).
var standardResources = map[string]bool{"cpu": true, "memory": true, "ephemeral-storage": true, "gpu": true}

// checkResourceName checks a Kubernetes qualified name: [prefix/]name, the
// prefix a DNS subdomain.
func checkResourceName(s string) error {
	prefix, name, hasPrefix := strings.Cut(s, "/")
	if !hasPrefix {
		prefix, name = "", s
	}
	if len(name) > 63 || !nameRE.MatchString(name) {
		return fmt.Errorf("%q: want at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (an optional prefix: example.com/gpu)", s)
	}
	if !hasPrefix {
		if !standardResources[name] {
			// Tasks may only ask for these or prefixed names (the API
			// refuses others), so an unprefixed claim could never be used.
			return fmt.Errorf("%q: an unprefixed name is one of cpu, memory, ephemeral-storage, gpu; name other resources with a domain prefix, e.g. example.com/%s", s, name)
		}
		return nil
	}
	if prefix == "kubernetes.io" || strings.HasSuffix(prefix, ".kubernetes.io") {
		return fmt.Errorf("%q: the kubernetes.io prefix is Kubernetes' own; use a domain of yours, e.g. example.com/%s", s, name)
	}
	if len(prefix) > 253 || prefix == "" {
		return fmt.Errorf("%q: the prefix before '/' must be a DNS subdomain of at most 253 characters", s)
	}
	for l := range strings.SplitSeq(prefix, ".") {
		if len(l) > 63 || !dnsLabelRE.MatchString(l) {
			return fmt.Errorf("%q: the prefix %q is not a DNS subdomain (lower-case letters, digits, '-' and '.')", s, prefix)
		}
	}
	return nil
}

// DetectCapacity is what the agent reports when Options.Capacity is nil:
// cpu and (on Linux) memory.
func DetectCapacity() map[string]string { return detectCapacity() }
