// Package features holds Drover's feature gates (k8s.io/component-base),
// set with --feature-gates on drover server, manager and hub.
package features

import (
	"fmt"
	"strings"

	"k8s.io/component-base/featuregate"
)

// DisableNodeTaskV1alpha2 switches off the node job controllers (manager)
// and executors (hub), as KubeEdge's gate of the same name does.
const DisableNodeTaskV1alpha2 featuregate.Feature = "disableNodeTaskV1alpha2"

// New returns a gate with Drover's features at their defaults. Each process
// makes its own: there is no package-level gate to mutate.
func New() featuregate.MutableFeatureGate {
	g := featuregate.NewFeatureGate()
	if err := g.Add(map[featuregate.Feature]featuregate.FeatureSpec{
		DisableNodeTaskV1alpha2: {Default: false, PreRelease: featuregate.Alpha},
	}); err != nil {
		panic(err) // static registration
	}
	return g
}

// Flag is a pflag.Value for --feature-gates that also takes KubeEdge's form,
// a bare name meaning name=true: --feature-gates=disableNodeTaskV1alpha2.
type Flag struct {
	Gate featuregate.MutableFeatureGate
}

// String implements pflag.Value.
func (f Flag) String() string { return "" }

// Type implements pflag.Value.
func (f Flag) Type() string { return "mapStringBool" }

// Set implements pflag.Value.
func (f Flag) Set(v string) error {
	parts := strings.Split(v, ",")
	for i, p := range parts {
		if p = strings.TrimSpace(p); p != "" && !strings.Contains(p, "=") {
			parts[i] = p + "=true"
		}
	}
	if err := f.Gate.Set(strings.Join(parts, ",")); err != nil {
		return fmt.Errorf("%w (known gates: %s)", err, strings.Join(f.Gate.KnownFeatures(), "; "))
	}
	return nil
}
