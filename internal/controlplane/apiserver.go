package controlplane

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/server/flagz"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kubeoptions "k8s.io/kubernetes/pkg/kubeapiserver/options"
)

const (
	// ServiceClusterIPRange is the range the apiserver allocates Service IPs
	// from. Nothing routes to it: no kube-proxy runs with Drover's control
	// plane.
	ServiceClusterIPRange = "10.96.0.0/16"
	// ServiceAccountIssuer is the issuer of service-account tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc"
)

// keptAdmissionPlugins are the default-on admission plugins Drover keeps.
// Every other default-on plugin is about pods, nodes, storage, quotas or
// certificates, which Drover does not serve; each one kept costs informers
// (memory) and startup time.
var keptAdmissionPlugins = []string{
	"NamespaceLifecycle",
	"MutatingAdmissionPolicy",
	"MutatingAdmissionWebhook",
	"ValidatingAdmissionPolicy",
	"ValidatingAdmissionWebhook",
}

// disabledAdmissionPlugins returns the default-on admission plugins not in
// keptAdmissionPlugins, computed from this kube-apiserver version's own lists
// so that an upgrade neither fails on a removed name nor silently enables a
// new plugin.
func disabledAdmissionPlugins() []string {
	off := kubeoptions.DefaultOffAdmissionPlugins()
	var out []string
	for _, name := range kubeoptions.AllOrderedPlugins {
		if off.Has(name) || contains(keptAdmissionPlugins, name) {
			continue
		}
		out = append(out, name)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// apiserverArgs returns the kube-apiserver flags for a loopback control
// plane with the given PKI and etcd. The serving port is not among them: the
// listener is passed in directly.
func apiserverArgs(p *pki, etcdURL, certDir string) []string {
	f := p.files
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The default reconciler writes the apiserver's address into the
		// "kubernetes" Endpoints; meaningless on loopback.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + certDir,
		"--tls-cert-file=" + f.servingCert(),
		"--tls-private-key-file=" + f.servingKey(),
		"--client-ca-file=" + f.caCert(),
		"--service-account-key-file=" + f.saPub(),
		"--service-account-signing-key-file=" + f.saKey(),
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--authorization-mode=RBAC",
		// One client population on one machine: APF's extra goroutines and
		// bootstrap objects buy nothing here.
		"--enable-priority-and-fairness=false",
		"--disable-admission-plugins=" + strings.Join(disabledAdmissionPlugins(), ","),
		"--profiling=false",
	}
}

// runAPIServer runs kube-apiserver in this process until ctx is cancelled.
// It returns an error at once if the flags are invalid.
//
// It does what the RunE of app.NewAPIServerCommand does, except that it
// neither installs signal handlers (genericapiserver.SetupSignalContext, which
// NewAPIServerCommand calls when it is constructed, may run once per process
// and exits on a second signal) nor reconfigures klog (logsapi.ValidateAndApply
// would send klog back to stderr); the caller owns both. The "logs" flags
// (--v, --vmodule, --logging-format) are therefore accepted but have no effect.
func runAPIServer(ctx context.Context, args []string, l net.Listener) error {
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	named := s.Flags()
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	s.Flagz = flagz.NamedFlagSetsReader{FlagSets: named}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("kube-apiserver flags: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	s.SecureServing.Listener = l
	s.SecureServing.BindPort = port
	if err := fs.Set("secure-port", strconv.Itoa(port)); err != nil {
		return fmt.Errorf("kube-apiserver flags: %w", err)
	}

	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return fmt.Errorf("kube-apiserver feature gates: %w", err)
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return fmt.Errorf("complete kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return fmt.Errorf("validate kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	return app.Run(ctx, completed)
}
