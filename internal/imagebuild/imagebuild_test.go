package imagebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64"}
)

// layerFile is one file read back from an image's layer.
type layerFile struct {
	hdr  *tar.Header
	data []byte
}

// readLayer returns every entry of the image's single layer by name.
func readLayer(t *testing.T, img v1.Image) map[string]layerFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1", len(layers))
	}
	if mt, err := layers[0].MediaType(); err != nil || mt != types.OCILayer {
		t.Errorf("layer media type = %v (%v), want %s", mt, err, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]layerFile{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = layerFile{hdr: h, data: b}
	}
	return files
}

// checkImage checks what every Drover image must be: its platform, its
// entrypoint and user, and an executable file at the entrypoint that is
// wantBinary.
func checkImage(t *testing.T, img v1.Image, spec Spec, p v1.Platform, wantBinary []byte) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("%s manifest media types = %s, %s; want OCI", spec.Name, m.MediaType, m.Config.MediaType)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		t.Errorf("%s config platform = %s/%s, want %s", spec.Name, cf.OS, cf.Architecture, p.String())
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{spec.Path}) {
		t.Errorf("%s entrypoint = %q, want [%s]", spec.Name, cf.Config.Entrypoint, spec.Path)
	}
	if want := fmt.Sprintf("%d:%d", spec.UID, spec.UID); cf.Config.User != want {
		t.Errorf("%s user = %q, want %q", spec.Name, cf.Config.User, want)
	}
	if cf.Config.WorkingDir != spec.WorkingDir {
		t.Errorf("%s working dir = %q, want %q", spec.Name, cf.Config.WorkingDir, spec.WorkingDir)
	}
	if cf.Config.Labels["org.opencontainers.image.source"] != SourceURL {
		t.Errorf("%s labels = %v, want org.opencontainers.image.source %s", spec.Name, cf.Config.Labels, SourceURL)
	}
	files := readLayer(t, img)
	f, ok := files[spec.Path[1:]]
	if !ok {
		t.Fatalf("%s layer has no %s; it has %v", spec.Name, spec.Path, keys(files))
	}
	if f.hdr.Typeflag != tar.TypeReg || f.hdr.Mode&0o111 != 0o111 {
		t.Errorf("%s %s: type %c mode %o, want an executable regular file", spec.Name, spec.Path, f.hdr.Typeflag, f.hdr.Mode)
	}
	if !bytes.Equal(f.data, wantBinary) {
		t.Errorf("%s %s: %d bytes that are not the binary built (%d bytes)", spec.Name, spec.Path, len(f.data), len(wantBinary))
	}
	if spec.WorkingDir != "/" {
		d, ok := files[spec.WorkingDir[1:]+"/"]
		if !ok || d.hdr.Uid != spec.UID {
			t.Errorf("%s working dir %s missing or not owned by %d: %+v", spec.Name, spec.WorkingDir, spec.UID, d.hdr)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func writeFile(t *testing.T, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(p, []byte(data), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func digest(t *testing.T, d interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestImageAssembly checks the image and index that Image and Index make
// from a given binary, without compiling anything.
func TestImageAssembly(t *testing.T) {
	meta := Meta{Version: "v1.2.3", Revision: "0123abcd", Created: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	for _, spec := range Specs() {
		t.Run(spec.Name, func(t *testing.T) {
			binA, binB := writeFile(t, "amd64 binary of "+spec.Name), writeFile(t, "arm64 binary of "+spec.Name)
			build := func(order ...PlatformImage) v1.ImageIndex {
				idx, err := Index(spec, meta, order)
				if err != nil {
					t.Fatal(err)
				}
				return idx
			}
			img := func(p v1.Platform, bin string) PlatformImage {
				i, err := Image(spec, p, bin, meta)
				if err != nil {
					t.Fatal(err)
				}
				return PlatformImage{Platform: p, Image: i}
			}
			a, b := img(amd64, binA), img(arm64, binB)
			idx := build(a, b)

			// The same inputs, built again and listed in another order, give the same digest.
			if d1, d2 := digest(t, idx), digest(t, build(img(arm64, binB), img(amd64, binA))); d1 != d2 {
				t.Errorf("index digest differs between two builds: %s, %s", d1, d2)
			}
			// Another time or version is another image.
			other, err := Image(spec, amd64, binA, Meta{Version: "v1.2.3", Created: meta.Created.Add(time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			if digest(t, other) == digest(t, a.Image) {
				t.Errorf("a different creation time gave the same digest")
			}

			// Written to an OCI layout and read back.
			dir := filepath.Join(t.TempDir(), spec.Name)
			if _, err := WriteLayout(dir, "v1.2.3", idx); err != nil {
				t.Fatal(err)
			}
			back, err := ReadLayout(dir)
			if err != nil {
				t.Fatal(err)
			}
			if digest(t, back) != digest(t, idx) {
				t.Errorf("layout index digest = %s, want %s", digest(t, back), digest(t, idx))
			}
			im, err := back.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 2 {
				t.Fatalf("index = %s with %d manifests, want an OCI index of 2", im.MediaType, len(im.Manifests))
			}
			if im.Annotations["org.opencontainers.image.revision"] != "0123abcd" || im.Annotations["org.opencontainers.image.version"] != "v1.2.3" {
				t.Errorf("index annotations = %v, want revision and version", im.Annotations)
			}
			for i, want := range []struct {
				p   v1.Platform
				bin string
			}{{amd64, binA}, {arm64, binB}} {
				d := im.Manifests[i]
				if d.Platform == nil || d.Platform.OS != want.p.OS || d.Platform.Architecture != want.p.Architecture {
					t.Errorf("manifest %d platform = %v, want %s", i, d.Platform, want.p.String())
				}
				got, err := back.Image(d.Digest)
				if err != nil {
					t.Fatal(err)
				}
				data, _ := os.ReadFile(want.bin)
				checkImage(t, got, spec, want.p, data)
				cf, _ := got.ConfigFile()
				if !cf.Created.Equal(meta.Created) || cf.Config.Labels["org.opencontainers.image.version"] != "v1.2.3" {
					t.Errorf("config created %v labels %v, want %v and version v1.2.3", cf.Created, cf.Config.Labels, meta.Created)
				}
				for n, f := range readLayer(t, got) {
					if !f.hdr.ModTime.Equal(meta.Created) || (f.hdr.Uid != 0 && f.hdr.Uid != NonRootUID) {
						t.Errorf("layer entry %s: mtime %v uid %d, want %v and root or nonroot", n, f.hdr.ModTime, f.hdr.Uid, meta.Created)
					}
				}
			}

			// Each platform's tarball is what docker load reads: it holds one image.
			tb := filepath.Join(t.TempDir(), TarballName(spec, amd64))
			if err := WriteTarball(tb, mustTag(t, Registry+"/"+spec.Name+":v1.2.3"), a.Image); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(tb); err != nil || fi.Size() == 0 {
				t.Errorf("tarball %s: %v", tb, err)
			}
		})
	}
}

func TestParsePlatforms(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "linux/amd64,linux/arm64", want: []string{"linux/amd64", "linux/arm64"}},
		{in: " linux/arm64 , linux/arm64,", want: []string{"linux/arm64"}},
		{in: "linux/arm/v7", want: []string{"linux/arm/v7"}},
		{in: "", wantErr: true},
		{in: "amd64", wantErr: true},
	} {
		got, err := ParsePlatforms(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("ParsePlatforms(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParsePlatforms(%q): %v", tc.in, err)
			continue
		}
		var s []string
		for _, p := range got {
			s = append(s, platformKey(p))
		}
		if !slices.Equal(s, tc.want) {
			t.Errorf("ParsePlatforms(%q) = %v, want %v", tc.in, s, tc.want)
		}
	}
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}
