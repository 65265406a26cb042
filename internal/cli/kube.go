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
	cfg, err := g.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig (run `drover server` first, or pass --kubeconfig): %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// namespace is flag when it is set, else the kubeconfig context's
// namespace, else "default" (as kubectl chooses).
func (g *globalOptions) namespace(flag string) string {
	if flag != "" {
		return flag
	}
	if ns, _, err := g.clientConfig().Namespace(); err == nil && ns != "" {
		return ns
	}
	return "default"
}

// namespaceFlagHelp ends the help of every -n flag.
const namespaceFlagHelp = " (default: the kubeconfig context's namespace, else default)"

func (g *globalOptions) clientConfig() clientcmd.ClientConfig {
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
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
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
