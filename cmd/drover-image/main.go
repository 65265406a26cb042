// Command drover-image builds Drover's container images (drover and
// drover-agent) for several platforms without Docker, reproducibly, and
// writes them as OCI layouts, optionally as tarballs for `docker load` /
// `ctr images import`, and optionally pushes them. See docs/images.md.
//
//	go run ./cmd/drover-image build --platform linux/amd64,linux/arm64 --out bin/images
//	go run ./cmd/drover-image build --push ghcr.io/me --tag v0.1.0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/drover-fleet/drover/internal/imagebuild"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "build" {
		return errors.New("usage: drover-image build [--platform linux/amd64,linux/arm64] [--out bin/images] [--image drover,drover-agent] [--tarball] [--push REGISTRY] [--tag TAG]")
	}
	fs := flag.NewFlagSet("drover-image build", flag.ContinueOnError)
	platforms := fs.String("platform", "linux/amd64,linux/arm64", "comma-separated platforms to build for")
	out := fs.String("out", "bin/images", "directory for the OCI layouts (one per image: OUT/drover, OUT/drover-agent) and tarballs")
	only := fs.String("image", "drover,drover-agent", "comma-separated images to build")
	tarballs := fs.Bool("tarball", false, "also write OUT/NAME-OS-ARCH.tar per platform, for docker load / ctr images import")
	push := fs.String("push", "", "push the multi-platform images to REGISTRY/NAME:TAG (e.g. ghcr.io/me), with the credentials of ~/.docker/config.json")
	registry := fs.String("registry", imagebuild.Registry, "registry prefix of the tags in tarballs and layouts")
	version := fs.String("version", "", "version stamped into the binaries and labels (default: git describe --tags --always --dirty)")
	tag := fs.String("tag", "", "image tag (default: the version)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}

	root, err := moduleRoot()
	if err != nil {
		return err
	}
	plats, err := imagebuild.ParsePlatforms(*platforms)
	if err != nil {
		return err
	}
	specs, err := selectSpecs(*only)
	if err != nil {
		return err
	}
	meta, err := metaFromGit(ctx, root, *version)
	if err != nil {
		return err
	}
	if *tag == "" {
		*tag = strings.ReplaceAll(meta.Version, "+", "-")
	}
	outDir := *out
	if !filepath.IsAbs(outDir) {
		outDir = filepath.Join(root, outDir)
	}

	began := time.Now()
	results, err := imagebuild.Build(ctx, imagebuild.Options{
		ModuleDir: root, BinDir: filepath.Join(outDir, "bin"), Specs: specs, Platforms: plats, Meta: meta,
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	for _, r := range results {
		ref, err := name.NewTag(*registry + "/" + r.Spec.Name + ":" + *tag)
		if err != nil {
			return fmt.Errorf("image reference for %s: %w", r.Spec.Name, err)
		}
		dir := filepath.Join(outDir, r.Spec.Name)
		if _, err := imagebuild.WriteLayout(dir, *tag, r.Index); err != nil {
			return err
		}
		d, err := r.Index.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s %s@%s (OCI layout %s)\n", r.Spec.Name, ref, d, dir)
		if *tarballs {
			for _, pi := range r.Images {
				file := filepath.Join(outDir, imagebuild.TarballName(r.Spec, pi.Platform))
				if err := imagebuild.WriteTarball(file, ref, pi.Image); err != nil {
					return err
				}
				fmt.Printf("  %s: %s\n", pi.Platform.String(), file)
			}
		}
		if *push != "" {
			pref, err := name.NewTag(strings.TrimSuffix(*push, "/") + "/" + r.Spec.Name + ":" + *tag)
			if err != nil {
				return fmt.Errorf("--push %q: %w", *push, err)
			}
			if err := imagebuild.Push(ctx, pref, r.Index); err != nil {
				return err
			}
			fmt.Printf("  pushed %s@%s\n", pref, d)
		}
	}
	fmt.Printf("done in %s\n", time.Since(began).Round(time.Second))
	return nil
}

func selectSpecs(list string) ([]imagebuild.Spec, error) {
	var out []imagebuild.Spec
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		found := false
		for _, s := range imagebuild.Specs() {
			if s.Name == n {
				out, found = append(out, s), true
			}
		}
		if !found && n != "" {
			return nil, fmt.Errorf("--image %q: unknown image, want drover or drover-agent", n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("--image: no image given")
	}
	return out, nil
}

// metaFromGit reads the version, revision and time of the source tree, so
// that two builds of one commit stamp the same values. SOURCE_DATE_EPOCH,
// when set, wins over the commit time (reproducible-builds.org).
func metaFromGit(ctx context.Context, root, version string) (imagebuild.Meta, error) {
	git := func(args ...string) string {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		b, err := cmd.Output()
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	m := imagebuild.Meta{Version: version, Revision: git("rev-parse", "HEAD")}
	if m.Version == "" {
		m.Version = git("describe", "--tags", "--always", "--dirty")
	}
	if m.Version == "" {
		m.Version = "dev"
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		epoch = git("log", "-1", "--format=%ct")
	}
	if epoch != "" {
		s, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return m, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since the Unix epoch: %w", epoch, err)
		}
		m.Created = time.Unix(s, 0).UTC()
	}
	return m, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run drover-image inside the Drover module (no go.mod at or above the working directory)")
		}
		dir = parent
	}
}
