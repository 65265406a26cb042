package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// -n defaults as kubectl's does: the kubeconfig context's namespace, else
// default.
func TestNamespaceDefault(t *testing.T) {
	const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts:
- {name: robots, context: {cluster: c, user: u, namespace: robots}}
- {name: plain, context: {cluster: c, user: u}}
current-context: %s
`
	tests := []struct {
		context, flag, want string
	}{
		{"robots", "", "robots"},
		{"robots", "other", "other"},
		{"plain", "", "default"},
	}
	for _, tt := range tests {
		path := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(kubeconfig, tt.context)), 0o600); err != nil {
			t.Fatal(err)
		}
		g := &globalOptions{kubeconfig: path}
		if got := g.namespace(tt.flag); got != tt.want {
			t.Errorf("context %s, -n %q: namespace %q, want %q", tt.context, tt.flag, got, tt.want)
		}
	}
}
