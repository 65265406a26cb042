package imagebuild

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// LDFlags are the linker flags of a release binary: no symbol table or
// DWARF (the agent must stay under 20 MiB), and the version stamped in.
func LDFlags(spec Spec, version string) string {
	flags := "-s -w"
	if version != "" && spec.VersionVar != "" {
		flags += " -X " + spec.VersionVar + "=" + version
	}
	return flags
}

// GoBuild builds spec's binary for platform into out, from the module at
// dir, the way the images need it: static (CGO_ENABLED=0), with -trimpath
// so that no path of the build machine ends up in it, and LDFlags. goBin is
// the go command ("" finds it on PATH).
func GoBuild(ctx context.Context, goBin, dir string, spec Spec, platform v1.Platform, version, out string) error {
	if goBin == "" {
		goBin = "go"
	}
	args := []string{"build", "-trimpath", "-ldflags", LDFlags(spec, version), "-o", out, spec.Package}
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	env := []string{"CGO_ENABLED=0", "GOOS=" + platform.OS, "GOARCH=" + platform.Architecture}
	if platform.Architecture == "arm" && strings.HasPrefix(platform.Variant, "v") {
		env = append(env, "GOARM="+strings.TrimPrefix(platform.Variant, "v"))
	}
	cmd.Env = append(os.Environ(), env...)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build %s for %s (%s go %s): %w\n%s", spec.Package, platform.String(),
			strings.Join(env, " "), strings.Join(args, " "), err, output.String())
	}
	return nil
}
