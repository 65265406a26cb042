package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/convert"
)

// convertOptions are the flags of `drover convert`.
type convertOptions struct {
	files          []string
	output         string
	artifactURL    string
	artifactImage  string
	artifactSHA256 string
	artifactSecret string // namespace/name

	in        io.Reader
	out, warn io.Writer
}

func newConvertCommand() *cobra.Command {
	o := &convertOptions{}
	cmd := &cobra.Command{
		Use:   "convert -f FILE [-o yaml|json]",
		Short: "Convert KubeEdge NodeUpgradeJob and ImagePrePullJob manifests to Drover's",
		Long: `Convert KubeEdge node job manifests (operations.kubeedge.io v1alpha1 and
v1alpha2 NodeUpgradeJob and ImagePrePullJob) to Drover's
(operations.drover.io/v1alpha1) and print them, ready for kubectl apply -f -.

Every field that has a Drover equivalent is mapped. Warnings on stderr name
what was dropped because nothing is lost (status, server-set metadata,
KubeEdge's finalizers). A field that would change what the job does and has
no equivalent is an error naming the document and the field; on any error
nothing is printed and the exit status is 1.

KubeEdge upgrades nodes from an installation-package image; Drover replaces
the drover-agent binary and checks its SHA-256, so NodeUpgradeJobs need
--artifact-url or --artifact-image, and --artifact-sha256.`,
		Example: `  drover convert -f upgrade.yaml --artifact-url https://example.com/drover-agent --artifact-sha256 4f2c... | kubectl apply -f -
  kubectl get imageprepulljobs.v1alpha2.operations.kubeedge.io -o yaml | drover convert -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.in, o.out, o.warn = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringSliceVarP(&o.files, "filename", "f", nil, "file, directory (its *.yaml, *.yml, *.json) or - for stdin; repeatable")
	f.StringVarP(&o.output, "output", "o", "yaml", "output format: yaml or json")
	f.StringVar(&o.artifactURL, "artifact-url", "", "NodeUpgradeJobs: http(s) URL of the drover-agent binary")
	f.StringVar(&o.artifactImage, "artifact-image", "", "NodeUpgradeJobs: OCI image whose single layer is the drover-agent binary")
	f.StringVar(&o.artifactSHA256, "artifact-sha256", "", "NodeUpgradeJobs: hex SHA-256 of the drover-agent binary")
	f.StringVar(&o.artifactSecret, "artifact-image-secret", "", "NodeUpgradeJobs: namespace/name of a dockerconfigjson Secret for --artifact-image")
	return cmd
}

// Validate checks the flags alone; the artifact's own rules are convert's.
func (o *convertOptions) Validate() error {
	if len(o.files) == 0 {
		return errors.New("name the manifests with -f FILE, -f DIR or -f - (stdin)")
	}
	if o.output != "yaml" && o.output != "json" {
		return fmt.Errorf("-o %q: want yaml or json", o.output)
	}
	if o.artifactSecret != "" {
		if ns, name, ok := strings.Cut(o.artifactSecret, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return fmt.Errorf("--artifact-image-secret %q: want namespace/name", o.artifactSecret)
		}
	}
	return nil
}

func (o *convertOptions) artifact() *opsv1.AgentArtifact {
	if o.artifactURL == "" && o.artifactImage == "" && o.artifactSHA256 == "" && o.artifactSecret == "" {
		return nil
	}
	a := &opsv1.AgentArtifact{URL: o.artifactURL, Image: o.artifactImage, SHA256: o.artifactSHA256}
	if ns, name, ok := strings.Cut(o.artifactSecret, "/"); ok {
		a.ImageSecretRef = &corev1.SecretReference{Namespace: ns, Name: name}
	}
	return a
}

// Run converts and prints. It prints no manifest when any document fails:
// piped into kubectl apply, half a conversion would run half the jobs.
func (o *convertOptions) Run(_ context.Context) error {
	var docs []convert.Document
	for _, path := range o.files {
		d, err := convert.ReadPath(path, o.in)
		if err != nil {
			return err
		}
		docs = append(docs, d...)
	}
	res, err := convert.Convert(docs, convert.Options{Artifact: o.artifact()})
	if err != nil {
		return fmt.Errorf("--artifact-*: %w", err)
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(o.warn, "Warning: %s\n", w)
	}
	if err := res.Err(); err != nil {
		return fmt.Errorf("%d error(s), nothing converted:\n%w", len(res.Errors), err)
	}
	if len(res.Objects) == 0 {
		return errors.New("no manifests in the input")
	}
	return convert.Write(o.out, res.Objects, o.output)
}
