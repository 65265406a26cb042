// Package signer is the one part of Drover that holds its CA key: the
// manager runs it, and hubs ask it for every certificate (the node
// certificates of Register and Renew, their own serving and MQTT
// certificates) and to check bootstrap tokens, so that a hub reads no
// Secret at all.
//
// The Service serves gRPC over TLS (signerv1.Signer) to `drover hub`
// processes, which call it through a Client, and in the process to the hub
// of `drover server` (Service.Local): both go through the same checks.
// Remote callers authenticate with a bearer token (their ServiceAccount's)
// checked with a TokenReview and need `create` on the virtual subresource
// fleetnodes/certificate (a SubjectAccessReview); both answers are cached
// (package tokencache), so a registration costs the API nothing.
//
// A hub is not trusted with identities: before it signs a node's
// certificate, the signer checks again, from its own informer cache, that
// the FleetNode exists, is approved and not revoked, was registered with
// the request's key, and that the key is not on the revocation list. A
// FleetNode a hub created a moment ago may not be cached yet: a refusal
// waits a moment for the cache (cacheLag), then is confirmed with one read
// of the API. Hub certificates carry names the signer chooses from the
// hub's name (drover-hub-<hub>); the hub picks only the hosts.
//
// The signer keeps the ConfigMap drover-ca-bundle (hub.BundleName) equal
// to the CA Secret's certificates: hubs trust and serve from it, and
// verify the signer's own serving certificate with it.
//
// Operators' tools call it too (SignOperator, operator.go): `drover logs`
// trades the bearer token of a kubeconfig for a 10-minute operator
// certificate (pki.SignOperatorCSR) that carries the identity a
// TokenReview gave, so that the token never reaches a hub. The signer's
// serving certificate carries the DNS name ServerName ("drover-signer"),
// which no hub's may (hub.SignerServerName): the CLI sends its token only
// to a server that proves it. The signer publishes where it listens on the
// bundle ConfigMap (hub.AnnotationSignerAddress), which log readers may get.
//
// What it does not do: decide whether a node may register (the hub does,
// under the signer's checks), approve nodes, or rotate the CA (`drover ca
// rotate` does; the signer follows within caRefresh).
package signer
