package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Options are the inputs of Build.
type Options struct {
	// ModuleDir is the root of the Drover module (where go.mod is).
	ModuleDir string
	// GoBin is the go command; empty means "go" on PATH.
	GoBin string
	// BinDir is where the binaries are built, one file per image and
	// platform. Required.
	BinDir string
	// Specs are the images to build; empty means Specs().
	Specs []Spec
	// Platforms to build for. Required.
	Platforms []v1.Platform
	// Meta is stamped on every image; Meta.Version also into the binaries.
	Meta Meta
	// Logf, when set, is told what is being built.
	Logf func(format string, args ...any)
}

// Result is one built image: its index and the image of each platform.
type Result struct {
	Spec   Spec
	Index  v1.ImageIndex
	Images []PlatformImage
	// Binaries maps a platform ("linux/amd64") to the binary in its image.
	Binaries map[string]string
}

// ParsePlatforms parses a comma-separated list such as
// "linux/amd64,linux/arm64".
func ParsePlatforms(s string) ([]v1.Platform, error) {
	var out []v1.Platform
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := v1.ParsePlatform(f)
		if err != nil {
			return nil, fmt.Errorf("platform %q: %w", f, err)
		}
		if p.OS == "" || p.Architecture == "" {
			return nil, fmt.Errorf("platform %q: want os/arch, e.g. linux/amd64", f)
		}
		if seen[platformKey(*p)] {
			continue
		}
		seen[platformKey(*p)] = true
		out = append(out, *p)
	}
	if len(out) == 0 {
		return nil, errors.New("no platform given: want e.g. linux/amd64,linux/arm64")
	}
	return out, nil
}

// Build compiles each spec's binary for each platform and assembles the
// images and their indexes. It writes nothing but the binaries; see
// WriteLayout, WriteTarball and Push.
func Build(ctx context.Context, o Options) ([]Result, error) {
	if o.BinDir == "" {
		return nil, errors.New("build images: BinDir is required")
	}
	if len(o.Platforms) == 0 {
		return nil, errors.New("build images: no platform given")
	}
	specs := o.Specs
	if len(specs) == 0 {
		specs = Specs()
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(o.BinDir, 0o755); err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	var results []Result
	for _, spec := range specs {
		r := Result{Spec: spec, Binaries: map[string]string{}}
		for _, p := range o.Platforms {
			key := platformKey(p)
			bin := filepath.Join(o.BinDir, spec.Name+"-"+strings.ReplaceAll(key, "/", "-"))
			logf("building %s for %s", spec.Package, key)
			if err := GoBuild(ctx, o.GoBin, o.ModuleDir, spec, p, o.Meta.Version, bin); err != nil {
				return nil, err
			}
			img, err := Image(spec, p, bin, o.Meta)
			if err != nil {
				return nil, err
			}
			r.Images = append(r.Images, PlatformImage{Platform: p, Image: img})
			r.Binaries[key] = bin
		}
		idx, err := Index(spec, o.Meta, r.Images)
		if err != nil {
			return nil, err
		}
		r.Index = idx
		results = append(results, r)
	}
	return results, nil
}
