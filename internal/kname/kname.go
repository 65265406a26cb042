// Package kname fits Drover's names into the shapes Kubernetes allows.
package kname

// LabelValue fits name into a label value: at most 63 bytes, ending with
// an alphanumeric. Names are DNS subdomains, so nothing else needs fixing.
// Two long names may map to one value: a label selects a first cut, and
// an owner reference or uid decides.
func LabelValue(name string) string {
	if len(name) <= 63 {
		return name
	}
	v := name[:63]
	for len(v) > 0 && !isAlnum(v[len(v)-1]) {
		v = v[:len(v)-1]
	}
	return v
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
