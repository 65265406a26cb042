// Package api holds Drover's Kubernetes API types, one package per group and
// version. It imports only apimachinery (and k8s.io/api for shared types).
package api

//go:generate go tool controller-gen object paths=./...
//go:generate go tool controller-gen crd:crdVersions=v1 paths=./... output:crd:artifacts:config=../config/crd/bases
