package appctl

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/uuid"
)

// SliceName is the InstanceSlice of app on node: "<app>-<node>", cut and
// suffixed with a hash of both when longer than an object name may be.
func SliceName(app, node string) string {
	n := app + "-" + node
	if len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(app + "/" + node))
	return trimName(n[:236]) + "-" + hex.EncodeToString(sum[:])[:16]
}

// newInstanceName is a fresh instance name for app: a DNS label (the
// slice's schema), "<app>-<8 hex>", unique among taken.
func newInstanceName(app string, taken func(string) bool) string {
	prefix := strings.ReplaceAll(app, ".", "-")
	if len(prefix) > 50 {
		prefix = prefix[:50]
	}
	prefix = trimName(prefix)
	for {
		id := strings.ReplaceAll(string(uuid.NewUUID()), "-", "")
		n := prefix + "-" + id[:8]
		if !taken(n) {
			return n
		}
	}
}

// trimName drops what a name may not end with.
func trimName(s string) string {
	return strings.TrimRight(s, "-.")
}
