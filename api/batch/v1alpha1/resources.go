package v1alpha1

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// StandardResources are the resource names a task may ask for without a
// domain prefix: what an agent detects (cpu, memory) or is told it has
// (ephemeral-storage, gpu: drover-agent --capacity).
var StandardResources = []corev1.ResourceName{
	corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage, "gpu",
}

// CheckResourceName refuses a resource name that is neither standard nor a
// domain-prefixed extended resource (example.com/fpga), as Kubernetes
// refuses a Pod's: a misspelt name would otherwise wait forever as
// "insufficient memroy". The API refuses these too
// (config/admission/batch_resources.yaml); this is the same rule.
func CheckResourceName(name corev1.ResourceName) error {
	s := string(name)
	for _, std := range StandardResources {
		if s == string(std) {
			return nil
		}
	}
	prefix, _, prefixed := strings.Cut(s, "/")
	if prefixed && prefix != "kubernetes.io" && !strings.HasSuffix(prefix, ".kubernetes.io") &&
		len(validation.IsQualifiedName(s)) == 0 {
		return nil
	}
	msg := "not a resource name: use cpu, memory, ephemeral-storage, gpu, or a domain-prefixed extended resource such as example.com/fpga"
	if prefixed {
		msg = "not an extended resource name: want a DNS domain (not kubernetes.io), '/', and at most 63 letters, digits, '-', '_' or '.', such as example.com/fpga"
	} else if near := nearestStandard(s); near != "" {
		msg += "; did you mean " + near + "?"
	}
	return fmt.Errorf("%q is %s", s, msg)
}

// nearestStandard is the standard name within two edits of s, or "".
func nearestStandard(s string) string {
	best, bestD := "", 3
	for _, std := range StandardResources {
		if d := editDistance(strings.ToLower(s), string(std)); d < bestD {
			best, bestD = string(std), d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (short names only).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
