// Package controlplane runs a real Kubernetes API server inside the calling
// process: embedded etcd (go.etcd.io/etcd/server/v3/embed) plus the
// kube-apiserver built from the Kubernetes Go modules. `drover server` uses it
// so that one machine needs no cluster, and `drover controlplane` (a hidden
// command) uses it so that tests can start a real API server as a subprocess.
//
// What Start does, in order:
//
//  1. creates or reuses a small PKI in DataDir/pki (cluster CA, apiserver
//     serving certificate for 127.0.0.1/localhost, an admin client
//     certificate in group system:masters, a service-account key pair);
//  2. starts etcd with its data in DataDir/etcd, listening on loopback ports
//     picked free at each start;
//  3. starts kube-apiserver on 127.0.0.1 (RBAC, client-certificate auth,
//     priority-and-fairness off, only the admission plugins Drover needs);
//  4. waits until /readyz answers ok;
//  5. writes an admin kubeconfig to DataDir/kubeconfig (rewritten at every
//     start, because the port may change).
//
// Restarting with the same DataDir keeps every object (same etcd data) and the
// same CA, so kubeconfigs written before stay valid if the port is fixed.
//
// Logs: kube-apiserver logs through klog and etcd through zap; both are
// written in full to DataDir/apiserver.log and DataDir/etcd.log, and only
// their errors are forwarded to Options.Logger.
//
// One control plane per process. kube-apiserver keeps process-wide state
// (klog's logger, feature gates, the legacy metrics registry, some
// once-only registrations), so a second Start in the same process, even after
// the first stopped, is refused. Tests that need a control plane should run
// `drover controlplane` as a subprocess through internal/testenv, which also
// keeps the ~200 MB apiserver out of every test binary.
//
// Shutdown: cancel the ctx given to Start and call Wait. The API server stops
// first, then etcd. This package never installs OS signal handlers: the
// kube-apiserver's own command (app.NewAPIServerCommand) does, as soon as it
// is constructed, and panics if that happens twice in one process, so Start
// drives the apiserver's options and app.Run directly instead.
//
// InstallCRDs works against any cluster, not only the embedded one.
package controlplane
