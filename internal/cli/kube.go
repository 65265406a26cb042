package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/manager"
)

// defaultDataDir is where `drover server` and `drover up` keep their state.
const defaultDataDir = ".drover"

// restConfig finds the cluster: --kubeconfig, $KUBECONFIG, the local
// `drover server` data dir, then ~/.kube/config.
func (g *globalOptions) restConfig() (*rest.Config, error) {
	path := g.kubeconfig
	if path == "" {
		path = os.Getenv("KUBECONFIG")
	}
	if path == "" {
		if _, err := os.Stat(filepath.Join(defaultDataDir, "kubeconfig")); err == nil {
			path = filepath.Join(defaultDataDir, "kubeconfig")
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig (run `drover server` first, or pass --kubeconfig): %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

func (g *globalOptions) client() (client.Client, error) {
	cfg, err := g.restConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("connect to the API: %w", err)
	}
	return c, nil
}
