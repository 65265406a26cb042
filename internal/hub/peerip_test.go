package hub

import (
	"net"
	"testing"
)

// TestPeerIP: the node's address a feature gives clients is the IP of its
// connection, without the port; none for a connection without one.
func TestPeerIP(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5000}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("fd00::7"), Port: 5000}, "fd00::7"},
		{&net.UDPAddr{IP: net.IPv4(192, 168, 0, 9), Port: 1}, "192.168.0.9"},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, ""},
		{nil, ""},
	} {
		if got := peerIP(tc.addr); got != tc.want {
			t.Errorf("peerIP(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}
