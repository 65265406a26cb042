package convert_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/convert"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestOutputIsAcceptedByTheCRDs dry-run creates every object converted from
// testdata against Drover's real CRDs (schema and CEL rules), so that the
// mapping cannot drift from what the apiserver accepts. A broken object
// shows the dry run does validate.
func TestOutputIsAcceptedByTheCRDs(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var objs []convert.Object
	for _, in := range inputs {
		if _, res := run(t, in); len(res.Errors) == 0 {
			objs = append(objs, res.Objects...)
		}
	}
	if len(objs) < 8 {
		t.Fatalf("only %d objects converted from testdata; want every kind and version covered", len(objs))
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.Kind] = true
		if err := env.Client.Create(t.Context(), toUnstructured(t, o), client.DryRunAll); err != nil {
			t.Errorf("dry-run create %s %s: %v", o.Kind, o.Metadata.Name, err)
		}
	}
	if !kinds["NodeUpgradeJob"] || !kinds["ImagePrePullJob"] {
		t.Errorf("kinds converted = %v, want both", kinds)
	}

	// The control: the same path refuses what the CRD forbids.
	bad := toUnstructured(t, objs[0])
	if err := unstructured.SetNestedField(bad.Object, "2", "spec", "failureTolerate"); err != nil {
		t.Fatal(err)
	}
	err = env.Client.Create(t.Context(), bad, client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "failureTolerate") {
		t.Errorf("dry-run create with failureTolerate 2 = %v, want the CRD to refuse it", err)
	}
}

func toUnstructured(t *testing.T, o convert.Object) *unstructured.Unstructured {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	return u
}
