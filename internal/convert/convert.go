package convert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

// KubeEdge's API group; both of its versions are read.
const (
	kubeEdgeGroup = "operations.kubeedge.io"
	kindUpgrade   = "NodeUpgradeJob"
	kindPrePull   = "ImagePrePullJob"
)

// Options are what the KubeEdge manifests cannot say.
type Options struct {
	// Artifact becomes spec.artifact of every converted NodeUpgradeJob.
	// KubeEdge upgrades from an installation-package image (keadm and
	// edgecore); Drover replaces the drover-agent binary and checks its
	// SHA-256, so the binary must be named here. Without it a
	// NodeUpgradeJob is an error.
	Artifact *opsv1.AgentArtifact
}

var sha256Hex = regexp.MustCompile(`^[a-f0-9]{64}$`)

func (o Options) validate() error {
	a := o.Artifact
	if a == nil {
		return nil
	}
	if (a.URL == "") == (a.Image == "") {
		return errors.New("the artifact needs exactly one of a URL and an image")
	}
	if !sha256Hex.MatchString(a.SHA256) {
		return errors.New("the artifact's SHA-256 must be 64 lowercase hex digits")
	}
	if a.ImageSecretRef != nil && a.Image == "" {
		return errors.New("an artifact image secret needs an artifact image; a URL carries no credentials")
	}
	return nil
}

// Problem is an error or a warning about one field of one document.
type Problem struct {
	Source string // file, or "-"
	Doc    int    // document in Source, from 1
	Item   int    // item of a List document, from 1; 0 if not a List
	Kind   string
	Name   string
	Field  string // JSON path in the KubeEdge document, e.g. spec.image
	Msg    string
}

func (p Problem) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: document %d", p.Source, p.Doc)
	if p.Item > 0 {
		fmt.Fprintf(&b, " item %d", p.Item)
	}
	switch {
	case p.Kind != "" && p.Name != "":
		fmt.Fprintf(&b, " (%s %q)", p.Kind, p.Name)
	case p.Kind != "":
		fmt.Fprintf(&b, " (%s)", p.Kind)
	}
	if p.Field != "" {
		fmt.Fprintf(&b, ": %s", p.Field)
	}
	return b.String() + ": " + p.Msg
}

// Object is a converted manifest: only what a user writes, so that the
// output reads like a hand-written manifest and applies cleanly.
type Object struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   Metadata `json:"metadata"`
	Spec       any      `json:"spec"`
}

// Metadata is the part of ObjectMeta a manifest carries.
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	GenerateName string            `json:"generateName,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
}

// Result is the outcome of Convert. Objects are only meant to be used when
// Errors is empty: a partial output applied would run some of the jobs.
type Result struct {
	Objects  []Object
	Warnings []Problem
	Errors   []Problem
}

// Err joins the errors, nil if there are none.
func (r Result) Err() error {
	errs := make([]error, len(r.Errors))
	for i, p := range r.Errors {
		errs[i] = errors.New(p.String())
	}
	return errors.Join(errs...)
}

// Convert converts every document; it goes on after an error so that one
// run reports all of them.
func Convert(docs []Document, opts Options) (Result, error) {
	if err := opts.validate(); err != nil {
		return Result{}, err
	}
	c := &converter{opts: opts}
	for _, d := range docs {
		c.document(d)
	}
	return c.res, nil
}

type converter struct {
	opts Options
	res  Result
	// upgradeVersion and upgradeAt are the version of the first
	// NodeUpgradeJob given opts.Artifact: one binary has one version.
	upgradeVersion string
	upgradeAt      *doc
}

// doc is the document being converted, for naming it in problems.
type doc struct {
	c          *converter
	source     string
	index      int
	item       int
	kind, name string
	apiVersion string
	failed     bool
}

func (d *doc) problem(field, format string, args ...any) Problem {
	return Problem{Source: d.source, Doc: d.index, Item: d.item, Kind: d.kind, Name: d.name, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (d *doc) errorf(field, format string, args ...any) {
	d.failed = true
	d.c.res.Errors = append(d.c.res.Errors, d.problem(field, format, args...))
}

func (d *doc) warnf(field, format string, args ...any) {
	d.c.res.Warnings = append(d.c.res.Warnings, d.problem(field, format, args...))
}

func (c *converter) document(in Document) {
	d := &doc{c: c, source: in.Source, index: in.Index}
	if bytes.Equal(bytes.TrimSpace(in.JSON), []byte("null")) {
		return // an empty document, e.g. after a trailing ---
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(in.JSON, &top); err != nil {
		d.errorf("", "not a Kubernetes object: want a map with apiVersion and kind")
		return
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	_ = json.Unmarshal(in.JSON, &tm) // a wrong type leaves them empty, reported below
	if tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List") && strings.HasPrefix(tm.APIVersion, kubeEdgeGroup+"/") {
		// `kubectl get nodeupgradejobs -o yaml` writes a List.
		var items []json.RawMessage
		if err := json.Unmarshal(top["items"], &items); err != nil && len(top["items"]) > 0 {
			d.kind = tm.Kind
			d.errorf("items", "not a list of objects: %v", err)
			return
		}
		for i, it := range items {
			c.object(&doc{c: c, source: in.Source, index: in.Index, item: i + 1}, it)
		}
		return
	}
	c.object(d, in.JSON)
}

// object converts one KubeEdge object.
func (c *converter) object(d *doc, data []byte) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		d.errorf("", "not a Kubernetes object: want a map with apiVersion and kind")
		return
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(data, &tm)
	d.kind, d.name, d.apiVersion = tm.Kind, tm.Metadata.Name, tm.APIVersion
	group, version, _ := strings.Cut(tm.APIVersion, "/")
	switch {
	case tm.APIVersion == "" || tm.Kind == "":
		d.errorf("", "no apiVersion or kind: not a Kubernetes manifest")
		return
	case group == opsv1.GroupVersion.Group:
		d.errorf("apiVersion", "%s is already Drover's; apply it as it is", tm.APIVersion)
		return
	case group != kubeEdgeGroup:
		d.errorf("apiVersion", "%s %s is not a KubeEdge node job; convert reads %s/v1alpha1 and v1alpha2 %s and %s", tm.APIVersion, tm.Kind, kubeEdgeGroup, kindUpgrade, kindPrePull)
		return
	case version != "v1alpha1" && version != "v1alpha2":
		d.errorf("apiVersion", "%s is a KubeEdge version convert does not know; it reads v1alpha1 and v1alpha2", tm.APIVersion)
		return
	case tm.Kind != kindUpgrade && tm.Kind != kindPrePull:
		d.errorf("kind", "%s has no Drover equivalent; convert reads %s and %s", tm.Kind, kindUpgrade, kindPrePull)
		return
	}
	for _, k := range sortedKeys(top) {
		switch k {
		case "apiVersion", "kind", "metadata", "spec":
		case "status":
			if !isEmpty(top[k]) {
				d.warnf("status", "dropped: it is KubeEdge's record of a run; Drover's manager writes its own")
			}
		default:
			d.errorf(k, "unknown field of a %s", tm.Kind)
		}
	}
	meta := d.metadata(top["metadata"])
	var spec any
	switch tm.Kind {
	case kindUpgrade:
		spec = d.upgradeSpec(top["spec"])
	case kindPrePull:
		spec = d.prePullSpec(top["spec"])
	}
	if d.failed {
		return
	}
	c.res.Objects = append(c.res.Objects, Object{
		APIVersion: opsv1.GroupVersion.String(),
		Kind:       tm.Kind,
		Metadata:   meta,
		Spec:       spec,
	})
}

// metadata keeps what a user writes and drops what the apiserver or
// KubeEdge's controllers wrote.
func (d *doc) metadata(raw json.RawMessage) Metadata {
	var m map[string]json.RawMessage
	if isEmpty(raw) {
		d.errorf("metadata", "missing: a job needs a name")
		return Metadata{}
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		d.errorf("metadata", "not an object: %v", err)
		return Metadata{}
	}
	var out Metadata
	for _, k := range sortedKeys(m) {
		v := m[k]
		if isEmpty(v) {
			continue
		}
		var err error
		switch k {
		case "name":
			err = json.Unmarshal(v, &out.Name)
		case "generateName":
			err = json.Unmarshal(v, &out.GenerateName)
		case "labels":
			err = json.Unmarshal(v, &out.Labels)
		case "annotations":
			err = json.Unmarshal(v, &out.Annotations)
			// It records the KubeEdge object; kept, kubectl apply would
			// diff the Drover object against it.
			delete(out.Annotations, "kubectl.kubernetes.io/last-applied-configuration")
			if len(out.Annotations) == 0 {
				out.Annotations = nil
			}
		case "namespace":
			d.warnf("metadata.namespace", "dropped: node jobs are cluster-scoped in KubeEdge and Drover")
		case "finalizers":
			// A KubeEdge controller's finalizer on a Drover object would
			// never be removed, and the job could never be deleted.
			d.warnf("metadata.finalizers", "dropped: they belong to KubeEdge's controllers")
		case "ownerReferences":
			d.warnf("metadata.ownerReferences", "dropped: the owners are objects of the KubeEdge cluster")
		case "uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
			"selfLink", "deletionTimestamp", "deletionGracePeriodSeconds":
			// Written by the apiserver; meaningless in a manifest.
		default:
			d.errorf("metadata."+k, "unknown metadata field")
		}
		if err != nil {
			d.errorf("metadata."+k, "%v", err)
		}
	}
	if out.Name == "" && out.GenerateName == "" {
		d.errorf("metadata.name", "missing: a job needs a name")
	}
	return out
}

func isEmpty(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null")) || bytes.Equal(t, []byte("{}"))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
