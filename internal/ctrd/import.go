package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// refAnnotation names an image in an OCI layout's index (the pre-pull
// store's convention, OCI image spec).
const refAnnotation = "org.opencontainers.image.ref.name"

// importImage copies image ref from the OCI image layout at dir (the agent's
// pre-pull store) into containerd's namespace and unpacks it, so that a
// containerd task of that image starts without a pull. Registry access and
// credentials stay with the agent's pre-pull; this reads local files only.
func (o *options) importImage(ctx context.Context) int {
	if o.layout == "" || o.image == "" {
		fmt.Fprintln(os.Stderr, "drover-containerd import: --layout and --image are required")
		return 2
	}
	if err := o.doImport(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "drover-containerd import: %v\n", err)
		return 1
	}
	fmt.Printf("imported %s into containerd namespace %s\n", o.image, o.namespace)
	return 0
}

func (o *options) doImport(ctx context.Context) error {
	tag, err := name.NewTag(o.image)
	if err != nil {
		// A digest reference: containerd names the image by it as given.
		d, derr := name.NewDigest(o.image)
		if derr != nil {
			return fmt.Errorf("image %q is not a reference: %w", o.image, err)
		}
		tag = d.Context().Tag("imported")
	}
	lp, err := layout.FromPath(o.layout)
	if err != nil {
		return fmt.Errorf("open the image store %s: %w", o.layout, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return fmt.Errorf("read the image store %s: %w", o.layout, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return fmt.Errorf("read the image store %s: %w", o.layout, err)
	}
	var found bool
	for _, d := range im.Manifests {
		if d.Annotations[refAnnotation] != o.image {
			continue
		}
		v1img, err := lp.Image(d.Digest)
		if err != nil {
			return fmt.Errorf("image %s in the store: %w", o.image, err)
		}
		found = true
		c, err := o.connect()
		if err != nil {
			return err
		}
		defer c.Close()
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarball.Write(tag, v1img, pw)) }()
		imgs, err := c.Import(ctx, pr, containerd.WithImageRefTranslator(func(string) string { return o.image }))
		pr.CloseWithError(errors.New("import ended"))
		if err != nil {
			return fmt.Errorf("import %s into containerd: %w", o.image, err)
		}
		for _, i := range imgs {
			if err := containerd.NewImageWithPlatform(c, i, nil).Unpack(ctx, o.snapshotter); err != nil {
				return fmt.Errorf("unpack %s into snapshotter %s: %w", i.Name, o.snapshotter, err)
			}
		}
		break
	}
	if !found {
		return fmt.Errorf("image %s is not in the image store %s (pull it first)", o.image, o.layout)
	}
	return nil
}
