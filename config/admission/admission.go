// Package admission embeds Drover's ValidatingAdmissionPolicies: the API
// rules the CRD schemas cannot hold (see each manifest for why).
package admission

import (
	"embed"
	"io/fs"
	"sort"
)

//go:embed *.yaml
var manifests embed.FS

// Manifests returns every policy manifest, sorted by file name.
func Manifests() ([][]byte, error) {
	names, err := fs.Glob(manifests, "*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([][]byte, 0, len(names))
	for _, n := range names {
		b, err := manifests.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
