package tasklogs

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/drover-fleet/drover/internal/pki"
)

// The kubeconfig credentials drover logs cannot use are refused before
// anything is sent anywhere, saying why.
func TestClientCredentialsRefusals(t *testing.T) {
	ca, err := pki.NewCA("drover-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  *rest.Config
		want string
	}{
		{"an exec plugin", &rest.Config{ExecProvider: &clientcmdapi.ExecConfig{Command: "login-helper"}}, "exec or auth-provider plugin"},
		{"an auth-provider plugin", &rest.Config{AuthProvider: &clientcmdapi.AuthProviderConfig{Name: "oidc"}}, "exec or auth-provider plugin"},
		{"no credentials", &rest.Config{}, "neither a client certificate nor a bearer token"},
		{"a token, no signer to trade it at", &rest.Config{BearerToken: "secret"}, "--signer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := clientCredentials(context.Background(), Options{Config: tt.cfg, CAPEM: ca.CertPEM})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one saying %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows the token: %v", err)
			}
		})
	}
}
