package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	kubeEdgePrePull = `apiVersion: operations.kubeedge.io/v1alpha2
kind: ImagePrePullJob
metadata: {name: warm, namespace: kubeedge}
spec:
  imagePrePullTemplate: {images: [nginx:1.27], nodeNames: [edge-1], imageSecrets: default/regcred}
`
	kubeEdgeUpgrade = `apiVersion: operations.kubeedge.io/v1alpha1
kind: NodeUpgradeJob
metadata: {name: up}
spec: {version: v1.16.0, nodeNames: [edge-1], image: kubeedge/installation-package}
`
)

func runConvert(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := NewRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"convert"}, args...))
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// TestConvertPrintsDroverManifests: manifests on stdout, what was dropped
// on stderr, success.
func TestConvertPrintsDroverManifests(t *testing.T) {
	out, errOut, err := runConvert(t, kubeEdgePrePull, "-f", "-")
	if err != nil {
		t.Fatalf("convert = %v; stderr:\n%s", err, errOut)
	}
	for _, want := range []string{"apiVersion: operations.drover.io/v1alpha1", "kind: ImagePrePullJob", "name: regcred", "namespace: default"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "kubeedge") {
		t.Errorf("stdout keeps the KubeEdge namespace or group:\n%s", out)
	}
	if !strings.Contains(errOut, "Warning: -: document 1 (ImagePrePullJob \"warm\"): metadata.namespace: dropped") {
		t.Errorf("stderr = %q, want the dropped namespace named", errOut)
	}
}

// TestConvertFailsWithoutPrintingAnything: one document in error means no
// output at all (a pipe into kubectl apply would apply the rest), an error
// naming document and field, and a non-zero exit.
func TestConvertFailsWithoutPrintingAnything(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(kubeEdgePrePull), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.yml"), []byte(kubeEdgeUpgrade), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a manifest"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runConvert(t, "", "-f", dir)
	if err == nil {
		t.Fatal("convert of a NodeUpgradeJob without --artifact-* succeeded")
	}
	if out != "" {
		t.Errorf("stdout = %q, want nothing on error", out)
	}
	want := filepath.Join(dir, "b.yml") + `: document 1 (NodeUpgradeJob "up"): spec.image:`
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--artifact-sha256") {
		t.Errorf("error = %v, want it to name %q and the flags to pass", err, want)
	}

	// With the binary named, the directory converts, in file order.
	sha := strings.Repeat("0f", 32)
	out, errOut, err := runConvert(t, "", "-f", dir, "-o", "json",
		"--artifact-url", "https://downloads.example.com/drover-agent", "--artifact-sha256", sha)
	if err != nil {
		t.Fatalf("convert = %v; stderr:\n%s", err, errOut)
	}
	if !strings.Contains(out, `"kind": "List"`) || strings.Index(out, `"ImagePrePullJob"`) > strings.Index(out, `"NodeUpgradeJob"`) || !strings.Contains(out, sha) {
		t.Errorf("stdout is not a List of a.yaml's then b.yml's job with the artifact:\n%s", out)
	}
	if !strings.Contains(errOut, "spec.image: dropped") {
		t.Errorf("stderr = %q, want the replaced image named", errOut)
	}
}

func TestConvertRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-f", "-", "-o", "wide"},
		{"-f", "-", "--artifact-url", "https://x.example/a"}, // no SHA-256
		{"-f", "-", "--artifact-url", "https://x.example/a", "--artifact-image", "a:b", "--artifact-sha256", strings.Repeat("0f", 32)},
		{"-f", "-", "--artifact-image-secret", "regcred"},
		{"-f", filepath.Join(t.TempDir(), "missing.yaml")},
	} {
		if out, _, err := runConvert(t, kubeEdgePrePull, args...); err == nil || out != "" {
			t.Errorf("convert %v = %q, %v; want an error and no output", args, out, err)
		}
	}
}
