package controlplane

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdMemberName is the name of the single etcd member. It is stored in the
// data dir, so it must never change.
const etcdMemberName = "drover"

// startEtcd starts a single-member etcd with its data in dir, serving clients
// and peers on free loopback ports, and waits until it is ready.
//
// The ports may differ from one start to the next: with an existing data dir
// etcd does not check its stored peer URL, and a single member never dials a
// peer. Only the client URL matters, and it is passed to the apiserver anew
// at each start.
func startEtcd(ctx context.Context, dir string, lg *zap.Logger, timeout time.Duration) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))}

	cfg := embed.NewConfig()
	cfg.Name = etcdMemberName
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	// kube-apiserver compacts etcd itself (every 5 minutes); no metrics
	// listener, no v2 gateway.
	cfg.ListenMetricsUrls = nil
	cfg.Metrics = "basic"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd in %s: %w", dir, err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("etcd in %s failed while starting: %w", dir, err)
	case <-timer.C:
		e.Close()
		return nil, "", fmt.Errorf("etcd in %s not ready after %s (see etcd.log)", dir, timeout)
	case <-ctx.Done():
		e.Close()
		return nil, "", fmt.Errorf("start etcd in %s: %w", dir, ctx.Err())
	}
}

// freePort asks the kernel for a free loopback TCP port. Another process may
// take it before we bind it; on loopback with a 28k-port range that is rare,
// and the start then fails with a clear "address in use" error.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
