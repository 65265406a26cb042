package hub

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/peer"
)

// maxSources bounds the sources the register limiter tracks. Past it, a
// source idle long enough for its bucket to refill is forgotten (it would
// start full anyway); if none is, a new source is held only to the overall
// limit, so memory stays bounded whatever addresses a flood comes from.
const maxSources = 1 << 16

// registerLimiter bounds Register calls overall and per source address.
type registerLimiter struct {
	overall *rate.Limiter
	// perSource and burst make each source's limiter; perSource is
	// rate.Inf when sources are not limited.
	perSource rate.Limit
	burst     int

	mu      sync.Mutex
	sources map[netip.Prefix]*sourceLimiter
	// swept is when sources was last swept: at most once a refill, so a
	// flood from new addresses does not sweep a full map on every call.
	swept time.Time
}

type sourceLimiter struct {
	lim      *rate.Limiter
	lastSeen time.Time
}

func newRegisterLimiter(overall rate.Limit, overallBurst int, perSource rate.Limit, perSourceBurst int) *registerLimiter {
	return &registerLimiter{
		overall:   rate.NewLimiter(overall, overallBurst),
		perSource: perSource,
		burst:     perSourceBurst,
		sources:   map[netip.Prefix]*sourceLimiter{},
	}
}

// allow takes one call from source at now. When it refuses, it says
// whether the source's limit or the overall one refused, and when to
// retry; a refused call takes nothing from either limit.
func (l *registerLimiter) allow(source netip.Prefix, now time.Time) (ok bool, perSource bool, retry time.Duration) {
	var src *rate.Reservation
	if s := l.source(source, now); s != nil {
		src = s.ReserveN(now, 1)
		if d := src.DelayFrom(now); d > 0 {
			src.CancelAt(now)
			return false, true, d
		}
	}
	all := l.overall.ReserveN(now, 1)
	if d := all.DelayFrom(now); d > 0 {
		all.CancelAt(now)
		if src != nil {
			src.CancelAt(now)
		}
		return false, false, d
	}
	return true, false, 0
}

// source returns the limiter of source, or nil when sources are not
// limited or there is no room to track it.
func (l *registerLimiter) source(source netip.Prefix, now time.Time) *rate.Limiter {
	if l.perSource == rate.Inf || !source.IsValid() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.sources[source]; ok {
		s.lastSeen = now
		return s.lim
	}
	if len(l.sources) >= maxSources {
		// A bucket idle this long is full again: forgetting it changes nothing.
		refill := time.Duration(float64(l.burst) / float64(l.perSource) * float64(time.Second))
		if now.Sub(l.swept) < refill {
			return nil
		}
		l.swept = now
		for k, s := range l.sources {
			if now.Sub(s.lastSeen) > refill {
				delete(l.sources, k)
			}
		}
		if len(l.sources) >= maxSources {
			return nil
		}
	}
	s := &sourceLimiter{lim: rate.NewLimiter(l.perSource, l.burst), lastSeen: now}
	l.sources[source] = s
	return s.lim
}

// peerSource is the source a call is limited under: the peer's IPv4
// address, or its IPv6 /64 (one host commonly holds a whole /64). It is
// invalid, and the call held to the overall limit only, when the peer is
// unknown (a call made in-process) or on loopback: a proxy in front of the
// hub, or a simulated fleet on the hub's host, is every agent at once.
func peerSource(ctx context.Context) netip.Prefix {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Prefix{}
	}
	var ip netip.Addr
	switch a := p.Addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		ap, err := netip.ParseAddrPort(p.Addr.String())
		if err != nil {
			return netip.Prefix{}
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsLoopback() {
		return netip.Prefix{}
	}
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	pfx, _ := ip.Prefix(bits)
	return pfx
}
