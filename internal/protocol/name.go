package protocol

import (
	"errors"
	"fmt"
)

// ErrInvalidNodeName is wrapped by ValidNodeName's errors.
var ErrInvalidNodeName = errors.New("invalid node name")

// ValidNodeName checks that name is a DNS-1123 subdomain, the rule Kubernetes
// applies to object names (a node becomes a FleetNode object): at most 253
// bytes of lowercase letters, digits, '-' and '.', where every dot-separated
// label starts and ends with a letter or digit. Like Kubernetes'
// IsDNS1123Subdomain, it does not limit a single label to 63 bytes.
//
// It is written here rather than imported so that drover-agent does not link
// k8s.io/apimachinery.
func ValidNodeName(name string) error {
	if r := nodeNameProblem(name); r != "" {
		return fmt.Errorf("node %q: %s: %w", clip(name), r, ErrInvalidNodeName)
	}
	return nil
}

func nodeNameProblem(name string) string {
	if name == "" {
		return "is empty"
	}
	if len(name) > MaxNodeNameBytes {
		return fmt.Sprintf("is %d bytes, more than %d", len(name), MaxNodeNameBytes)
	}
	start := 0 // index of the current label's first byte
	for i := 0; i <= len(name); i++ {
		if i < len(name) && name[i] != '.' {
			c := name[i]
			if !isLowerAlnum(c) && c != '-' {
				return fmt.Sprintf("has %q at %d, want lowercase letters, digits, '-' or '.'", c, i)
			}
			continue
		}
		// name[start:i] is a label.
		if i == start {
			return fmt.Sprintf("has an empty label at %d", i)
		}
		if !isLowerAlnum(name[start]) || !isLowerAlnum(name[i-1]) {
			return fmt.Sprintf("label %q must start and end with a lowercase letter or digit", name[start:i])
		}
		start = i + 1
	}
	return ""
}

func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }
