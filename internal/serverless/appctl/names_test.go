package appctl

import (
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestSliceName(t *testing.T) {
	if got := SliceName("web", "node-1"); got != "web-node-1" {
		t.Errorf("SliceName = %q", got)
	}
	long := strings.Repeat("a", 200) + ".b"
	a, b := SliceName(long, strings.Repeat("n", 100)), SliceName(long, strings.Repeat("n", 99)+"m")
	for _, n := range []string{a, b} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
	if a == b {
		t.Errorf("two long names map to one slice %q", a)
	}
}

func TestNewInstanceName(t *testing.T) {
	re := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	for _, app := range []string{"web", "my.app", strings.Repeat("x", 49) + ".y" + strings.Repeat("z", 100)} {
		n := newInstanceName(app, func(string) bool { return false })
		if len(n) > 63 || !re.MatchString(n) {
			t.Errorf("newInstanceName(%q) = %q: not a DNS label", app, n)
		}
	}
	seen := map[string]bool{}
	first := newInstanceName("web", func(string) bool { return false })
	seen[first] = true
	if n := newInstanceName("web", func(s string) bool { return seen[s] }); n == first {
		t.Errorf("name %q taken twice", n)
	}
}
