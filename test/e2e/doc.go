// Package e2e runs real drover and drover-agent processes against a real
// kube-apiserver and etcd, as a user would. The tests are in _test.go files;
// this package has no other code.
package e2e
