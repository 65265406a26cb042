package controlplane

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeconfigContext is the name of the cluster, user and context in the
// admin kubeconfig.
const KubeconfigContext = "drover"

// writeKubeconfig writes a self-contained admin kubeconfig (certificates
// embedded, mode 0600) for the apiserver at host.
func writeKubeconfig(path, host string, p *pki) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[KubeconfigContext] = &clientcmdapi.Cluster{
		Server:                   host,
		CertificateAuthorityData: p.caPEM,
	}
	cfg.AuthInfos[AdminUser] = &clientcmdapi.AuthInfo{
		ClientCertificateData: p.adminCertPEM,
		ClientKeyData:         p.adminKeyPEM,
	}
	cfg.Contexts[KubeconfigContext] = &clientcmdapi.Context{
		Cluster:  KubeconfigContext,
		AuthInfo: AdminUser,
	}
	cfg.CurrentContext = KubeconfigContext
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	return writeFileAtomic(path, b, 0o600)
}
