// Package rbac embeds the RBAC manifests for running Drover's manager and
// hubs in an existing cluster as ServiceAccounts (see README, "Running in
// an existing cluster"). The rules are derived from the code; the test
// applies them to a real kube-apiserver, checks them with
// SubjectAccessReviews and runs a manager, a hub and an agent with them.
package rbac

import (
	"embed"
	"io/fs"
	"sort"
)

//go:embed *.yaml
var files embed.FS

// Manifests returns every manifest file, in the order to apply them (by
// file name: the namespace first).
func Manifests() ([][]byte, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([][]byte, 0, len(names))
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
