package nodejob

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/types"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

// SliceBudget is the most bytes the nodes of one NodeTaskSlice may take,
// worst case: well under etcd's 1.5 MiB request limit and the 1 MiB goal.
const SliceBudget = 768 << 10

// Worst-case JSON bytes of the parts of a NodeTaskStatus, from the schema's
// limits (with room for keys and quoting).
const (
	entryBase  = 253 + 64 + 512 + 2*128 + 64 + 200
	actionSize = 64 + 8 + 256 + 32 + 80
	imageSize  = 512 + 8 + 256 + 60
	maxActions = 8 // NodeTaskStatus.ActionFlow's MaxItems
)

// NodesPerSlice is how many nodes fit in one slice of a job with images
// images (0 for upgrades), so that no slice exceeds SliceBudget even when
// every field is at its schema maximum.
func NodesPerSlice(images int) int {
	per := entryBase + maxActions*actionSize + images*imageSize
	n := SliceBudget / per
	return max(1, min(n, opsv1.MaxNodesPerSlice))
}

// SliceName is the name of a job's i-th slice. It includes the job's uid so
// that a job re-created with the same name never sees its predecessor's
// slices, even before garbage collection removed them.
func SliceName(kind, job string, uid types.UID, i int) string {
	prefix := "nuj"
	if kind == "ImagePrePullJob" {
		prefix = "ippj"
	}
	u := string(uid)
	if len(u) > 8 {
		u = u[:8]
	}
	name := fmt.Sprintf("%s-%s-%s-%d", prefix, job, u, i)
	if len(name) > 253 {
		// Job names are at most 253 bytes; keep the distinguishing tail.
		name = name[len(name)-253:]
		for len(name) > 0 && (name[0] == '-' || name[0] == '.') {
			name = name[1:]
		}
	}
	return name
}

// Partition sorts node names and cuts them into groups of at most per.
func Partition(nodes []string, per int) [][]string {
	sorted := append([]string(nil), nodes...)
	sort.Strings(sorted)
	var out [][]string
	for len(sorted) > 0 {
		n := min(per, len(sorted))
		out = append(out, sorted[:n:n])
		sorted = sorted[n:]
	}
	return out
}
