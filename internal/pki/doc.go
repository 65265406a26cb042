// Package pki is Drover's small certificate authority: it creates the CA that
// signs hub serving certificates, agent client certificates and short-lived
// operator certificates (operator.go), signs certificate requests with one
// template per usage, and makes keys and requests on the agent side.
//
// It uses only the standard library so that the agent can import it. It does
// not store anything: the hub keeps the CA in a Secret, the agent in its DB.
// Keys are ECDSA P-256: cheap to generate on small devices and fast to verify
// for tens of thousands of TLS handshakes.
package pki
