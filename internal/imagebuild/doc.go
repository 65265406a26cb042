// Package imagebuild assembles Drover's container images without Docker, the
// way ko does: a statically linked Go binary (CGO_ENABLED=0, -trimpath) in
// one layer on an empty base, an OCI config naming its entrypoint and user,
// and one multi-platform OCI index per image.
//
// Builds are reproducible: every file in the layer has a fixed owner, mode
// and modification time, the config's timestamps come from the caller
// (SOURCE_DATE_EPOCH or the commit time), and nothing of the build machine
// (no CA bundle, no /etc/passwd of its own) goes in. Two builds of the same
// tree give the same digests.
//
// What it does not do: it runs no container and knows no registry
// credentials of its own (Push uses the caller's Docker config keychain).
// cmd/drover-image is the command around it; docs/images.md the manual.
package imagebuild
