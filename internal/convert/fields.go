package convert

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

// Fields of KubeEdge's specs (the same in v1alpha1 and v1alpha2), with a
// hint for names users copy from KubeEdge's design proposals, which never
// made it into the API.
var (
	upgradeFields = map[string]string{
		"version": "", "timeoutSeconds": "", "nodeNames": "", "labelSelector": "", "image": "",
		"imageDigestGatter": "", "concurrency": "", "checkItems": "", "failureTolerate": "",
		"requireConfirmation": "",
		"upgradeTool":         "a field of KubeEdge's design proposal, not of its API; Drover always replaces its own agent binary",
		"nodes":               "did you mean nodeNames?",
	}
	prePullSpecFields = map[string]string{
		"imagePrePullTemplate":   "",
		"imagePrePullOverriders": "a field of KubeEdge's design proposal, not of its API; Drover has no per-node overrides: write one job per group of nodes",
	}
	prePullTemplateFields = map[string]string{
		"images": "", "nodeNames": "", "labelSelector": "", "checkItems": "", "failureTolerate": "",
		"concurrency": "", "timeoutSeconds": "", "imageSecrets": "", "retryTimes": "",
		"nodes":       "did you mean nodeNames?",
		"imageSecret": "did you mean imageSecrets (namespace/name)?",
	}
)

// Drover's bounds (see api/operations/v1alpha1), checked here to name the
// KubeEdge field rather than leave it to the apiserver's message about the
// Drover one.
const (
	maxNodeNames   = 1000
	maxImages      = 32
	maxConcurrency = 10000
	maxTimeout     = 86400
	maxRetryTimes  = 10
)

var failureTolerate = regexp.MustCompile(`^(0(\.[0-9]+)?|1(\.0+)?|\.[0-9]+)$`)

// fields checks the keys of the object at path against known and returns
// the set ones (null and absent are the same, as for the apiserver).
func (d *doc) fields(path string, raw json.RawMessage, known map[string]string) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	if isNull(raw) {
		return out
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		d.errorf(path, "want an object")
		return out
	}
	for _, k := range sortedKeys(m) {
		hint, ok := known[k]
		switch {
		case !ok:
			d.errorf(path+"."+k, "unknown field of KubeEdge's %s %s, with no Drover equivalent", d.apiVersion, d.kind)
		case hint != "":
			d.errorf(path+"."+k, "unknown field: %s", hint)
		case !isNull(m[k]):
			out[k] = m[k]
		}
	}
	return out
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

func (d *doc) str(path string, raw json.RawMessage) string {
	var s string
	if raw != nil && json.Unmarshal(raw, &s) != nil {
		d.errorf(path, "want a string, got %s", raw)
	}
	return s
}

func (d *doc) integer(path string, raw json.RawMessage) int64 {
	var n int64
	if raw != nil && json.Unmarshal(raw, &n) != nil {
		d.errorf(path, "want a whole number, got %s", raw)
	}
	return n
}

func (d *doc) boolean(path string, raw json.RawMessage) bool {
	var b bool
	if raw != nil && json.Unmarshal(raw, &b) != nil {
		d.errorf(path, "want true or false, got %s", raw)
	}
	return b
}

// set reads a list of strings that Drover keeps as a set: duplicates are
// dropped (KubeEdge ran them twice, Drover's schema refuses them).
func (d *doc) set(path string, raw json.RawMessage) []string {
	var list []string
	if raw == nil {
		return nil
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		d.errorf(path, "want a list of strings")
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range list {
		if seen[s] {
			d.warnf(path, "%q is listed twice; kept once", s)
			continue
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}

// target reads nodeNames and labelSelector: exactly one, as KubeEdge's
// documentation asks and Drover's schema requires.
func (d *doc) target(path string, f map[string]json.RawMessage) ([]string, *metav1.LabelSelector) {
	names := d.set(path+".nodeNames", f["nodeNames"])
	var sel *metav1.LabelSelector
	if raw := f["labelSelector"]; raw != nil {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		sel = &metav1.LabelSelector{}
		if err := dec.Decode(sel); err != nil {
			d.errorf(path+".labelSelector", "not a label selector: %v", err)
		} else if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			d.errorf(path+".labelSelector", "%v", err)
		}
	}
	switch {
	case len(names) > 0 && sel != nil:
		d.errorf(path, "both nodeNames and labelSelector are set; KubeEdge asks for one, Drover refuses both: keep one")
	case len(names) == 0 && sel == nil:
		d.errorf(path, "neither nodeNames nor labelSelector is set: the job would match no node")
	case len(names) > maxNodeNames:
		d.errorf(path+".nodeNames", "%d nodes; Drover takes at most %d names: use a labelSelector", len(names), maxNodeNames)
	}
	return names, sel
}

// execution reads the knobs both kinds share.
func (d *doc) execution(path string, f map[string]json.RawMessage, out *opsv1.JobExecution) {
	// 0 means the default in KubeEdge, and the defaults are the same
	// (concurrency 1, timeout 300 s): leave them unset.
	if n := d.integer(path+".concurrency", f["concurrency"]); n < 0 || n > maxConcurrency {
		d.errorf(path+".concurrency", "%d is out of Drover's range 1..%d", n, maxConcurrency)
	} else {
		out.Concurrency = int32(n)
	}
	if n := d.integer(path+".timeoutSeconds", f["timeoutSeconds"]); n < 0 || n > maxTimeout {
		d.errorf(path+".timeoutSeconds", "%d is out of Drover's range 1..%d (a day)", n, maxTimeout)
	} else {
		out.TimeoutSeconds = int32(n)
	}
	if s := d.str(path+".failureTolerate", f["failureTolerate"]); s != "" {
		if len(s) > 16 || !failureTolerate.MatchString(s) {
			d.errorf(path+".failureTolerate", "%q is not a decimal in [0, 1], e.g. \"0.1\"", s)
		}
		out.FailureTolerate = s
	}
	for _, item := range d.set(path+".checkItems", f["checkItems"]) {
		switch c := opsv1.CheckItem(item); c {
		case opsv1.CheckCPU, opsv1.CheckMemory, opsv1.CheckDisk:
			out.CheckItems = append(out.CheckItems, c)
		default:
			d.errorf(path+".checkItems", "%q is not a check KubeEdge or Drover knows (cpu, mem, disk)", item)
		}
	}
}

func (d *doc) upgradeSpec(raw json.RawMessage) *opsv1.NodeUpgradeJobSpec {
	f := d.fields("spec", raw, upgradeFields)
	out := &opsv1.NodeUpgradeJobSpec{}
	out.NodeNames, out.LabelSelector = d.target("spec", f)
	out.Version = d.str("spec.version", f["version"])
	if out.Version == "" {
		d.errorf("spec.version", "missing: the version to upgrade to")
	}
	out.RequireConfirmation = d.boolean("spec.requireConfirmation", f["requireConfirmation"])
	d.execution("spec", f, &out.JobExecution)

	// KubeEdge installs keadm and edgecore from an installation-package
	// image; Drover replaces the drover-agent binary, checked by its
	// SHA-256. Nothing in the KubeEdge spec names that binary.
	a := d.c.opts.Artifact
	if a == nil {
		field, what := "spec", "the job names no drover-agent binary"
		if f["image"] != nil {
			field, what = "spec.image", "KubeEdge's installation-package image (keadm and edgecore) has no Drover equivalent"
		}
		d.errorf(field, "%s: Drover installs a drover-agent binary checked by its SHA-256; "+
			"name it with --artifact-url or --artifact-image, and --artifact-sha256", what)
		return out
	}
	out.Artifact = *a.DeepCopy()
	if f["image"] != nil {
		d.warnf("spec.image", "dropped: replaced by the drover-agent artifact given on the command line")
	}
	if f["imageDigestGatter"] != nil {
		d.warnf("spec.imageDigestGatter", "dropped (with any registry token in it): Drover checks the artifact's SHA-256 instead")
	}
	if c := d.c; out.Version != "" {
		if c.upgradeAt == nil {
			c.upgradeVersion, c.upgradeAt = out.Version, d
		} else if out.Version != c.upgradeVersion {
			at := c.upgradeAt
			d.errorf("spec.version", "%s, but document %d of %s upgrades to %s: one --artifact-sha256 cannot be the binary of both; convert them separately",
				out.Version, at.index, at.source, c.upgradeVersion)
		}
	}
	return out
}

func (d *doc) prePullSpec(raw json.RawMessage) *opsv1.ImagePrePullJobSpec {
	f := d.fields("spec", raw, prePullSpecFields)
	const path = "spec.imagePrePullTemplate"
	out := &opsv1.ImagePrePullJobSpec{}
	if f["imagePrePullTemplate"] == nil {
		d.errorf(path, "missing: the images and nodes to pull them on")
		return out
	}
	t := d.fields(path, f["imagePrePullTemplate"], prePullTemplateFields)
	out.NodeNames, out.LabelSelector = d.target(path, t)
	out.Images = d.set(path+".images", t["images"])
	switch n := len(out.Images); {
	case n == 0:
		d.errorf(path+".images", "missing: no image to pull")
	case n > maxImages:
		d.errorf(path+".images", "%d images; Drover pulls at most %d per job: split the job", n, maxImages)
	}
	if s := d.str(path+".imageSecrets", t["imageSecrets"]); s != "" {
		ns, name, ok := strings.Cut(s, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			d.errorf(path+".imageSecrets", "%q: want namespace/name, as KubeEdge does", s)
		}
		out.ImageSecretRef = &corev1.SecretReference{Namespace: ns, Name: name}
	}
	if n := d.integer(path+".retryTimes", t["retryTimes"]); n < 0 || n > maxRetryTimes {
		d.errorf(path+".retryTimes", "%d is out of Drover's range 0..%d", n, maxRetryTimes)
	} else {
		out.RetryTimes = int32(n)
	}
	d.execution(path, t, &out.JobExecution)
	return out
}
