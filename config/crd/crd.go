// Package crd embeds Drover's generated CustomResourceDefinitions so that
// `drover server` and `drover install` can apply them without a checkout.
package crd

import (
	"embed"
	"io/fs"
	"sort"
)

//go:embed bases/*.yaml
var bases embed.FS

// Manifests returns every CRD manifest, sorted by file name.
func Manifests() ([][]byte, error) {
	names, err := fs.Glob(bases, "bases/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([][]byte, 0, len(names))
	for _, n := range names {
		b, err := bases.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
