package imagebuild

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// RefNameAnnotation names an index inside an OCI layout (what
// `skopeo copy oci:DIR:TAG` and `crane push --index` look for).
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes idx as the only index of a fresh OCI image layout at
// dir (removed first, so that a layout never mixes two builds), named tag.
func WriteLayout(dir, tag string, idx v1.ImageIndex) (layout.Path, error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("write OCI layout %s: remove the old one: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefNameAnnotation: tag})); err != nil {
		return "", fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	return p, nil
}

// ReadLayout returns the index written by WriteLayout at dir.
func ReadLayout(dir string) (v1.ImageIndex, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("read OCI layout %s: %d entries in index.json, want the 1 that drover-image writes", dir, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	return idx, nil
}

// WriteTarball writes one platform's image as a tarball that `docker load`
// and `ctr images import` read (neither loads a multi-platform index), tagged
// ref.
func WriteTarball(file string, ref name.Tag, img v1.Image) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("write image tarball %s: %w", file, err)
	}
	if err := tarball.WriteToFile(file, ref, img); err != nil {
		return fmt.Errorf("write image tarball %s: %w", file, err)
	}
	return nil
}

// Push writes idx to the registry as ref, with the credentials of the
// Docker config keychain (~/.docker/config.json, `docker login`,
// `crane auth login`).
func Push(ctx context.Context, ref name.Tag, idx v1.ImageIndex) error {
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// TarballName is the file name of one platform's tarball of spec.
func TarballName(spec Spec, p v1.Platform) string {
	return spec.Name + "-" + strings.ReplaceAll(platformKey(p), "/", "-") + ".tar"
}

func platformKey(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
