package imagebuild

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Registry is where Drover's release images live; the Helm chart and the
// kustomize base reference ghcr.io/drover-fleet/drover and
// ghcr.io/drover-fleet/drover-agent.
const Registry = "ghcr.io/drover-fleet"

// SourceURL is the org.opencontainers.image.source label of every image.
const SourceURL = "https://github.com/drover-fleet/drover"

// Users of the images. The control plane runs as the distroless "nonroot"
// user; the agent manages its host (upgrades itself, pulls images, runs
// tasks as other users), so it runs as root.
const (
	NonRootUID = 65532
	RootUID    = 0
)

// Spec describes one image: which Go package is its binary and how it runs.
type Spec struct {
	// Name is the image's repository name under a registry ("drover").
	Name string
	// Package is the Go package of the binary, relative to the module root.
	Package string
	// Path is where the binary lives in the image; it is the entrypoint.
	Path string
	// Args is the default command (the config's Cmd); empty means none.
	Args []string
	// UID is the numeric user (and group) the image runs as.
	UID int
	// WorkingDir is the process's working directory; it exists in the image
	// and belongs to UID.
	WorkingDir string
	// Env is the process environment besides what the runtime adds.
	Env []string
	// Title and Description become OCI labels.
	Title, Description string
	// VersionVar is the -X ldflags variable that carries the version.
	VersionVar string
}

// Drover is the image of the control plane and CLI binary: manager, hubs,
// `drover server`. It runs as the unprivileged user 65532.
func Drover() Spec {
	return Spec{
		Name:        "drover",
		Package:     "./cmd/drover",
		Path:        "/usr/local/bin/drover",
		UID:         NonRootUID,
		WorkingDir:  "/home/nonroot",
		Env:         []string{"HOME=/home/nonroot", "PATH=/usr/local/bin:/usr/bin:/bin"},
		Title:       "drover",
		Description: "Drover control plane (manager, hub, embedded server) and operator CLI",
		VersionVar:  "github.com/drover-fleet/drover/internal/cli.Version",
	}
}

// Agent is the image of drover-agent. It runs as root: it manages the host.
func Agent() Spec {
	return Spec{
		Name:        "drover-agent",
		Package:     "./cmd/drover-agent",
		Path:        "/usr/local/bin/drover-agent",
		UID:         RootUID,
		WorkingDir:  "/",
		Env:         []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Title:       "drover-agent",
		Description: "Drover agent: runs node jobs and tasks on a machine of the fleet",
		VersionVar:  "github.com/drover-fleet/drover/internal/agent/cmd.Version",
	}
}

// Specs returns the specs of all of Drover's images, in a fixed order.
func Specs() []Spec { return []Spec{Drover(), Agent()} }

// Meta is what an image says about its build. It must come from the source
// tree, never from the build machine, so that builds are reproducible.
type Meta struct {
	// Version is the org.opencontainers.image.version label ("v0.3.0").
	Version string
	// Revision is the commit (org.opencontainers.image.revision).
	Revision string
	// Created is the time stamped on the config, the history and every
	// file of the layer. The zero value means the Unix epoch.
	Created time.Time
}

func (m Meta) created() time.Time {
	if m.Created.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return m.Created.UTC().Truncate(time.Second)
}

// Labels returns the OCI labels of an image of spec.
func (s Spec) Labels(m Meta) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.source":      SourceURL,
		"org.opencontainers.image.title":       s.Title,
		"org.opencontainers.image.description": s.Description,
		"org.opencontainers.image.created":     m.created().Format(time.RFC3339),
	}
	if m.Version != "" {
		l["org.opencontainers.image.version"] = m.Version
	}
	if m.Revision != "" {
		l["org.opencontainers.image.revision"] = m.Revision
	}
	return l
}

// Image assembles the image of spec for one platform from binary, a file
// built for that platform (see GoBuild).
func Image(spec Spec, platform v1.Platform, binary string, meta Meta) (v1.Image, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("image %s for %s: read binary: %w", spec.Name, platform.String(), err)
	}
	created := meta.created()
	layerTar, err := layerTar(spec, bin, created)
	if err != nil {
		return nil, fmt.Errorf("image %s for %s: %w", spec.Name, platform.String(), err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image %s for %s: layer: %w", spec.Name, platform.String(), err)
	}

	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "drover-image: " + spec.Package + " -> " + spec.Path,
			Comment:   "built by cmd/drover-image",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s for %s: append layer: %w", spec.Name, platform.String(), err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s for %s: config: %w", spec.Name, platform.String(), err)
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: created}
	cf.OS, cf.Architecture, cf.Variant, cf.OSVersion = platform.OS, platform.Architecture, platform.Variant, platform.OSVersion
	cf.Author = SourceURL
	cf.Config.Entrypoint = []string{spec.Path}
	cf.Config.Cmd = append([]string(nil), spec.Args...)
	cf.Config.User = fmt.Sprintf("%d:%d", spec.UID, spec.UID)
	cf.Config.WorkingDir = spec.WorkingDir
	cf.Config.Env = append([]string(nil), spec.Env...)
	cf.Config.Labels = spec.Labels(meta)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s for %s: set config: %w", spec.Name, platform.String(), err)
	}
	return img, nil
}

// PlatformImage is one entry of a multi-platform index.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// Index gathers the images of one spec into an OCI image index, ordered by
// platform so that the order of the builds does not change the digest.
func Index(spec Spec, meta Meta, images []PlatformImage) (v1.ImageIndex, error) {
	sorted := append([]PlatformImage(nil), images...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Platform.String() < sorted[j].Platform.String() })
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, pi := range sorted {
		p := pi.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        pi.Image,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &p},
		})
	}
	// The index carries the labels as annotations too: registries such as
	// GHCR link a package to its repository from the index.
	idx = mutate.Annotations(idx, spec.Labels(meta)).(v1.ImageIndex)
	if _, err := idx.Digest(); err != nil {
		return nil, fmt.Errorf("index %s: %w", spec.Name, err)
	}
	return idx, nil
}

// layerTar returns the one layer of an image: the binary at spec.Path, the
// directories above it, /tmp, the working directory, and a minimal
// /etc/passwd and /etc/group so that the user has a name and a home.
func layerTar(spec Spec, bin []byte, created time.Time) ([]byte, error) {
	if !path.IsAbs(spec.Path) || path.Clean(spec.Path) != spec.Path {
		return nil, fmt.Errorf("binary path %q must be absolute and clean", spec.Path)
	}
	type entry struct {
		hdr  tar.Header
		data []byte
	}
	entries := map[string]entry{}
	dir := func(name string, mode int64, uid int) {
		name = strings.TrimPrefix(path.Clean(name), "/")
		if name == "" || name == "." {
			return
		}
		entries[name+"/"] = entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid}}
	}
	parents := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := entries[strings.TrimPrefix(d, "/")+"/"]; !ok {
				dir(d, 0o755, 0)
			}
		}
	}
	file := func(name string, mode int64, data []byte) {
		parents(name)
		name = strings.TrimPrefix(name, "/")
		entries[name] = entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, data: data}
	}

	dir("/tmp", 0o1777, 0)
	if spec.WorkingDir != "" && spec.WorkingDir != "/" {
		parents(spec.WorkingDir)
		dir(spec.WorkingDir, 0o755, spec.UID)
	}
	file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\n"+
		fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID)))
	file("/etc/group", 0o644, []byte("root:x:0:\n"+fmt.Sprintf("nonroot:x:%d:\n", NonRootUID)))
	file(spec.Path, 0o755, bin)

	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	// Sorted names put every directory before what it holds.
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := e.hdr
		h.ModTime = created
		h.Format = tar.FormatPAX
		if h.Uid != 0 {
			h.Uname, h.Gname = "nonroot", "nonroot"
		} else {
			h.Uname, h.Gname = "root", "root"
		}
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("layer: write %s: %w", n, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer: write %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}
