package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/serverless/appctl"
	"github.com/drover-fleet/drover/internal/serverless/sessionapi"
)

// sessionAPIOptions are the flags of the session API, which the leading
// manager serves to applications' customers.
type sessionAPIOptions struct {
	bind, certFile, keyFile string
}

func (s *sessionAPIOptions) addFlags(fs *pflag.FlagSet, defaultBind string) {
	fs.StringVar(&s.bind, "session-api-bind-address", defaultBind, "address the session API (serverless applications: customers open, get, watch and close sessions with an application token, over gRPC and HTTP/JSON) listens on, on the leading manager; "+
		"without TLS only a loopback address; port 0 picks a free one (printed as `session API listening on ADDR`); empty: not served")
	fs.StringVar(&s.certFile, "session-api-cert-file", "", "PEM certificate (chain) the session API serves TLS with; with --session-api-key-file")
	fs.StringVar(&s.keyFile, "session-api-key-file", "", "PEM private key of --session-api-cert-file")
}

func (s *sessionAPIOptions) validate() error {
	if s.bind == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(s.bind); err != nil {
		return fmt.Errorf("--session-api-bind-address %q: %w", s.bind, err)
	}
	if (s.certFile == "") != (s.keyFile == "") {
		return errors.New("--session-api-cert-file and --session-api-key-file go together")
	}
	return nil
}

// setup adds the session API to mgr, binding through apps.
func (s *sessionAPIOptions) setup(mgr ctrl.Manager, apps *appctl.Controller, log *slog.Logger) error {
	if s.bind == "" || apps == nil {
		return nil
	}
	var tlsConfig *tls.Config
	if s.certFile != "" {
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return fmt.Errorf("session API certificate: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	inf, err := mgr.GetCache().GetInformer(context.Background(), &serverlessv1.ApplicationSession{})
	if err != nil {
		return fmt.Errorf("session API: %w", err)
	}
	srv, err := sessionapi.New(sessionapi.Options{Opener: sessionapi.AppctlOpener{Controller: apps}, Client: mgr.GetClient(), Sessions: inf,
		Logger: log.With("component", "session-api"), Registerer: metrics.Registry})
	if err != nil {
		return err
	}
	return mgr.Add(&sessionapi.Runnable{Server: srv, Address: s.bind, TLS: tlsConfig, Ready: func(addr string) {
		// A line a script (and the tests) can wait for, as `ready` is.
		fmt.Fprintf(os.Stdout, "session API listening on %s\n", addr)
		log.Info("session API listening", "address", addr, "tls", tlsConfig != nil)
	}})
}
