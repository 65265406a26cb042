package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Operator certificates carry a person's (or tool's) Kubernetes identity,
// reviewed by the manager's signer from the operator's bearer token, to a
// hub: the token itself never reaches a hub, so a hub cannot replay it.
//
// Their usage is their own, so that no certificate serves two purposes:
//   - the subject is fixed (OperatorCommonName in OperatorOrganization),
//     whatever the request names: it is no node name (a node name has no
//     ':' or '#'), and not in the nodes' or hubs' organization, so it
//     cannot act as a node at a hub or at a broker;
//   - the extended key usage OIDOperatorUsage, which node and hub
//     certificates never carry, is what a hub requires to read the
//     identity; a node or hub certificate cannot pass for an operator;
//   - the identity is in the extension oidOperatorIdentity (DER: SEQUENCE
//     { user UTF8String, uid UTF8String, groups SEQUENCE OF UTF8String,
//     extra SEQUENCE OF SEQUENCE { key UTF8String, values SEQUENCE OF
//     UTF8String } (absent when empty) }),
//     never in the subject, so that no name-based rule elsewhere (broker
//     ACLs, kube client-CA rules) ever reads it.
//
// The '#' in OperatorCommonName is deliberate: Mosquitto (with
// use_identity_as_username) takes the common name as the user, and its
// ACL file check denies every access to a user or client id with '+' or
// '#' (its answer to CVE-2017-7650, "ACL denying access to client with
// dangerous username"); the topics its %u patterns would give hold a
// wildcard besides, which no publish may name. So an operator certificate
// gets no topic at an external broker either.
//
// The OIDs are under 2.25 (ITU-T X.667, the arc of UUID-derived numbers,
// which needs no registration): Drover has no registered arc. The number
// was drawn at random below 2^31, as Go's certificate parser reads no
// larger arc; a UUID-derived number is practically never that small, so
// no one else's OID is this one.
var (
	// OIDOperatorUsage is the extended key usage of operator certificates.
	OIDOperatorUsage = asn1.ObjectIdentifier{2, 25, 1517289009, 1}
	// oidOperatorIdentity is the extension that holds the identity.
	oidOperatorIdentity = asn1.ObjectIdentifier{2, 25, 1517289009, 2}
)

// The fixed subject of every operator certificate.
const (
	OperatorCommonName   = "drover:operator#"
	OperatorOrganization = "drover:operators"
)

// OperatorValidity is how long an operator certificate is valid: long
// enough for one `drover logs`, short enough that a copy is of little use.
const OperatorValidity = 10 * time.Minute

// Bounds of an identity, so that a certificate stays small.
const (
	maxOperatorName   = 1024
	maxOperatorGroups = 256
)

// OperatorIdentity is who an operator certificate speaks for: a
// TokenReview's user with its extra fields, which authorizers may read (a
// scoped token's scopes, a service account token's credential id), so the
// certificate never says more than the token did.
type OperatorIdentity struct {
	User   string `asn1:"utf8"`
	UID    string `asn1:"utf8"`
	Groups []string
	Extra  []OperatorExtra `asn1:"optional"`
}

// OperatorExtra is one extra field of a user: a key and its values.
type OperatorExtra struct {
	Key    string `asn1:"utf8"`
	Values []string
}

// ExtraMap is Extra as a map, the form SubjectAccessReviews take.
func (id OperatorIdentity) ExtraMap() map[string][]string {
	if len(id.Extra) == 0 {
		return nil
	}
	m := make(map[string][]string, len(id.Extra))
	for _, e := range id.Extra {
		m[e.Key] = append(m[e.Key], e.Values...)
	}
	return m
}

// OperatorExtras turns a user's extra map into Extra, sorted by key so the
// certificate is the same for the same user.
func OperatorExtras(m map[string][]string) []OperatorExtra {
	out := make([]OperatorExtra, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, OperatorExtra{Key: k, Values: slices.Clone(m[k])})
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (id OperatorIdentity) validate() error {
	switch {
	case id.User == "":
		return errors.New("operator identity: no user name")
	case len(id.User) > maxOperatorName || len(id.UID) > maxOperatorName:
		return fmt.Errorf("operator identity: user name or uid longer than %d bytes", maxOperatorName)
	case len(id.Groups) > maxOperatorGroups:
		return fmt.Errorf("operator identity: %d groups, more than %d", len(id.Groups), maxOperatorGroups)
	}
	for _, g := range id.Groups {
		if g == "" || len(g) > maxOperatorName {
			return fmt.Errorf("operator identity: a group name is empty or longer than %d bytes", maxOperatorName)
		}
	}
	if len(id.Extra) > maxOperatorGroups {
		return fmt.Errorf("operator identity: %d extra fields, more than %d", len(id.Extra), maxOperatorGroups)
	}
	for _, e := range id.Extra {
		if e.Key == "" || len(e.Key) > maxOperatorName || len(e.Values) > maxOperatorGroups {
			return fmt.Errorf("operator identity: an extra field's key is empty or longer than %d bytes, or it has more than %d values", maxOperatorName, maxOperatorGroups)
		}
		for _, v := range e.Values {
			if len(v) > maxOperatorName {
				return fmt.Errorf("operator identity: extra %s has a value longer than %d bytes", e.Key, maxOperatorName)
			}
		}
	}
	return nil
}

// SignOperatorCSR signs a DER PKCS#10 request for an operator certificate
// of id. Only the request's public key is taken from it (the subject is
// fixed, whatever the request names), so a node's request yields no node
// certificate here.
func (ca *CA) SignOperatorCSR(csrDER []byte, id OperatorIdentity, now time.Time, validity time.Duration) ([]byte, error) {
	csr, err := parseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	tmpl, err := operatorTemplate(id)
	if err != nil {
		return nil, err
	}
	return ca.sign(tmpl, csr.PublicKey, now, validity)
}

func operatorTemplate(id OperatorIdentity) (*x509.Certificate, error) {
	if err := id.validate(); err != nil {
		return nil, err
	}
	// Groups are written as UTF8Strings too: a group name need not be
	// printable.
	type extra struct {
		Key    string `asn1:"utf8"`
		Values []asn1.RawValue
	}
	extras := make([]extra, 0, len(id.Extra))
	for _, e := range id.Extra {
		extras = append(extras, extra{e.Key, utf8s(e.Values)})
	}
	ext, err := asn1.Marshal(struct {
		User   string `asn1:"utf8"`
		UID    string `asn1:"utf8"`
		Groups []asn1.RawValue
		Extra  []extra `asn1:"optional"`
	}{id.User, id.UID, utf8s(id.Groups), extras})
	if err != nil {
		return nil, fmt.Errorf("encode the operator identity: %w", err)
	}
	return &x509.Certificate{
		Subject:            pkix.Name{CommonName: OperatorCommonName, Organization: []string{OperatorOrganization}},
		KeyUsage:           x509.KeyUsageDigitalSignature,
		ExtKeyUsage:        []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		UnknownExtKeyUsage: []asn1.ObjectIdentifier{OIDOperatorUsage},
		ExtraExtensions:    []pkix.Extension{{Id: oidOperatorIdentity, Value: ext}},
	}, nil
}

func utf8s(ss []string) []asn1.RawValue {
	out := make([]asn1.RawValue, 0, len(ss))
	for _, s := range ss {
		out = append(out, asn1.RawValue{Tag: asn1.TagUTF8String, Bytes: []byte(s)})
	}
	return out
}

// IsOperatorCert reports whether c has the operator usage. It says nothing
// of who signed c: the caller checks the chain.
func IsOperatorCert(c *x509.Certificate) bool {
	return slices.ContainsFunc(c.UnknownExtKeyUsage, OIDOperatorUsage.Equal)
}

// OperatorIdentityOf reads the identity of an operator certificate: one
// with the operator usage, subject and identity extension. The caller has
// verified c's chain to Drover's CA.
func OperatorIdentityOf(c *x509.Certificate) (OperatorIdentity, error) {
	if !IsOperatorCert(c) || c.Subject.CommonName != OperatorCommonName || !slices.Equal(c.Subject.Organization, []string{OperatorOrganization}) {
		return OperatorIdentity{}, errors.New("not an operator certificate")
	}
	for _, e := range c.Extensions {
		if !e.Id.Equal(oidOperatorIdentity) {
			continue
		}
		var id OperatorIdentity
		rest, err := asn1.Unmarshal(e.Value, &id)
		if err != nil {
			return OperatorIdentity{}, fmt.Errorf("operator certificate identity: %w", err)
		}
		if len(rest) > 0 {
			return OperatorIdentity{}, errors.New("operator certificate identity: trailing data")
		}
		if err := id.validate(); err != nil {
			return OperatorIdentity{}, err
		}
		return id, nil
	}
	return OperatorIdentity{}, errors.New("operator certificate without an identity")
}
