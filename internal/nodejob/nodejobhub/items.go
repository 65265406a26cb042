package nodejobhub

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

func checks(x opsv1.JobExecution) nodejobwire.Checks {
	c := nodejobwire.Checks{}
	for _, it := range x.CheckItems {
		c.Items = append(c.Items, string(it))
	}
	if t := x.CheckThresholds; t != nil {
		if t.CPUPercent != nil {
			c.CPUPercent = int(*t.CPUPercent)
		}
		if t.MemPercent != nil {
			c.MemPercent = int(*t.MemPercent)
		}
		if t.DiskPercent != nil {
			c.DiskPercent = int(*t.DiskPercent)
		}
	}
	return c
}

// jobItem builds the item every node of job holds.
func (e *Executor) jobItem(ctx context.Context, job opsv1.NodeJob) (*agentv1.WorkItem, error) {
	uid := string(job.GetUID())
	switch j := job.(type) {
	case *opsv1.NodeUpgradeJob:
		a := j.Spec.Artifact
		var auth map[string]nodejobwire.Credential
		if a.Image != "" {
			var err error
			if auth, err = e.credentials(ctx, a.ImageSecretRef, []string{a.Image}); err != nil {
				return nil, fmt.Errorf("artifact: %w", err)
			}
		}
		spec, _ := json.Marshal(nodejobwire.UpgradeSpec{Job: j.Name, Version: j.Spec.Version, URL: a.URL, Image: a.Image, SHA256: a.SHA256, Auth: auth,
			RequireConfirmation: j.Spec.RequireConfirmation, TimeoutSeconds: int(j.Spec.TimeoutSeconds), Checks: checks(j.Spec.JobExecution)})
		return &agentv1.WorkItem{Uid: uid, Type: nodejobwire.TypeUpgrade, Spec: spec}, nil
	case *opsv1.ImagePrePullJob:
		auth, err := e.credentials(ctx, j.Spec.ImageSecretRef, j.Spec.Images)
		if err != nil {
			return nil, err
		}
		spec, _ := json.Marshal(nodejobwire.PrePullSpec{Job: j.Name, Images: j.Spec.Images, Auth: auth, RetryTimes: int(j.Spec.RetryTimes),
			TimeoutSeconds: int(j.Spec.TimeoutSeconds), Checks: checks(j.Spec.JobExecution)})
		return &agentv1.WorkItem{Uid: uid, Type: nodejobwire.TypePrePull, Spec: spec}, nil
	}
	return nil, fmt.Errorf("unknown node job kind %T", job)
}

// itemsFor is what node holds of job: the job's item, and the confirmation
// once an upgrade that needs one is confirmed for node.
func itemsFor(job opsv1.NodeJob, base *agentv1.WorkItem, node string) []*agentv1.WorkItem {
	items := []*agentv1.WorkItem{base}
	if j, ok := job.(*opsv1.NodeUpgradeJob); ok && j.Spec.RequireConfirmation {
		confirmed := false
		if c := j.Spec.Confirmed; c != nil {
			confirmed = c.All || slices.Contains(c.NodeNames, node)
		}
		if confirmed {
			spec, _ := json.Marshal(nodejobwire.ConfirmSpec{By: j.Spec.Confirmed.By})
			items = append(items, &agentv1.WorkItem{Uid: nodejobwire.ConfirmUID(string(j.GetUID())), Type: nodejobwire.TypeConfirm, Spec: spec})
		}
	}
	return items
}

// credentials reads a dockerconfigjson Secret and keeps only the
// registries images are on.
func (e *Executor) credentials(ctx context.Context, ref *corev1.SecretReference, images []string) (map[string]nodejobwire.Credential, error) {
	if ref == nil {
		return nil, nil
	}
	if ref.Namespace == "" || ref.Name == "" {
		// The schema refuses it; a job stored before it said so fails.
		return nil, &secretError{ref: *ref, err: errors.New("needs a name and a namespace")}
	}
	var s corev1.Secret
	if err := e.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &s); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return nil, &secretError{ref: *ref, err: err}
		}
		// Transient (the apiserver is away): the reconcile retries.
		return nil, fmt.Errorf("imageSecretRef %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	all, err := parseDockerConfig(s.Data[corev1.DockerConfigJsonKey])
	if err != nil {
		return nil, &secretError{ref: *ref, err: fmt.Errorf("key %s: %w", corev1.DockerConfigJsonKey, err)}
	}
	out := map[string]nodejobwire.Credential{}
	for _, im := range images {
		r, err := name.ParseReference(im)
		if err != nil {
			continue
		}
		reg := r.Context().RegistryStr()
		if c, ok := all[reg]; ok {
			out[reg] = c
		}
	}
	return out, nil
}

// secretError is a job's imageSecretRef that cannot be used: missing,
// not readable by the hub, or not a .dockerconfigjson. Retrying does not
// help, so the job's nodes fail with it.
type secretError struct {
	ref corev1.SecretReference
	err error
}

func (e *secretError) Error() string {
	return fmt.Sprintf("imageSecretRef %s/%s cannot be used: %v", e.ref.Namespace, e.ref.Name, e.err)
}

func (e *secretError) Unwrap() error { return e.err }

// parseDockerConfig reads a .dockerconfigjson into registry → credential.
func parseDockerConfig(b []byte) (map[string]nodejobwire.Credential, error) {
	var cfg struct {
		Auths map[string]struct {
			Username string `json:"username"`
			Password string `json:"password"`
			Auth     string `json:"auth"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("not a .dockerconfigjson: %w", err)
	}
	out := map[string]nodejobwire.Credential{}
	for host, a := range cfg.Auths {
		c := nodejobwire.Credential{Username: a.Username, Password: a.Password}
		if a.Auth != "" && c.Username == "" {
			raw, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("auth of %s is not base64", host)
			}
			c.Username, c.Password, _ = strings.Cut(string(raw), ":")
		}
		out[normalizeRegistry(host)] = c
	}
	return out, nil
}

func normalizeRegistry(h string) string {
	h = strings.TrimPrefix(strings.TrimPrefix(h, "https://"), "http://")
	h, _, _ = strings.Cut(h, "/")
	if h == "docker.io" || h == "registry-1.docker.io" {
		return name.DefaultRegistry
	}
	return h
}
