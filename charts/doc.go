// Package charts holds Drover's Helm chart (charts/drover) and its tests:
// `helm lint`, `helm template` and `kustomize build config/default` with
// the tools pinned in tools/go.mod, each output applied with a server-side
// dry run to a real kube-apiserver (internal/testenv).
//
// The chart's CRDs, RBAC and admission policies are generated from
// config/crd/bases, config/rbac and config/admission (go generate), so
// that the chart grants exactly what the manifests the RBAC test checks
// grant, in the release's namespace.
package charts

//go:generate go run ./gen
