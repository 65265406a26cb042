package tenancyadmit

import (
	"net"
	"testing"

	"k8s.io/utils/ptr"
)

func TestParseService(t *testing.T) {
	for in, want := range map[string]*Service{
		"drover-system/drover-webhook":      {Namespace: "drover-system", Name: "drover-webhook", Port: 443},
		"drover-system/drover-webhook:9443": {Namespace: "drover-system", Name: "drover-webhook", Port: 9443},
		"drover-webhook":                    nil,
		"/x":                                nil,
		"a/b:0":                             nil,
		"a/b:http":                          nil,
	} {
		got, err := ParseService(in)
		if want == nil {
			if err == nil {
				t.Errorf("ParseService(%q) = %+v, want an error", in, got)
			}
			continue
		}
		if err != nil || *got != *want {
			t.Errorf("ParseService(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

func TestClientConfig(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4zero, Port: 9443}
	for _, c := range []struct {
		opts      Options
		url       string
		svc       bool
		wantHosts []string
	}{
		{Options{}, "https://127.0.0.1:9443/validate-tenancy", false, []string{"127.0.0.1"}},
		{Options{URL: "https://drover.example.com:8443"}, "https://drover.example.com:8443/validate-tenancy", false, []string{"drover.example.com"}},
		{Options{URL: "https://10.1.2.3/hooks/tenancy", Hosts: []string{"10.1.2.3", "hooks"}}, "https://10.1.2.3/hooks/tenancy", false, []string{"10.1.2.3", "hooks"}},
		{Options{Service: &Service{Namespace: "ns", Name: "hook", Port: 443}}, "", true, []string{"hook.ns.svc", "hook.ns.svc.cluster.local"}},
	} {
		s := &Server{opts: c.opts}
		cc, hosts := s.clientConfig(addr)
		if ptr.Deref(cc.URL, "") != c.url || (cc.Service != nil) != c.svc {
			t.Errorf("%+v: url %q service %v; want %q %v", c.opts, ptr.Deref(cc.URL, ""), cc.Service, c.url, c.svc)
		}
		if cc.Service != nil && (cc.Service.Name != "hook" || *cc.Service.Path != Path || *cc.Service.Port != 443) {
			t.Errorf("service %+v", cc.Service)
		}
		if len(hosts) != len(c.wantHosts) {
			t.Errorf("%+v: hosts %q, want %q", c.opts, hosts, c.wantHosts)
			continue
		}
		for i := range hosts {
			if hosts[i] != c.wantHosts[i] {
				t.Errorf("%+v: hosts %q, want %q", c.opts, hosts, c.wantHosts)
			}
		}
	}
}
