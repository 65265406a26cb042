package instance

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Ports assigns each instance of a node its own host port, so that
// instances never collide (they all listen on the node's address). It is
// safe for concurrent use.
type Ports struct {
	mu     sync.Mutex
	lo, hi int
	next   int
	used   map[int]string // port → owner
	owners map[string]int
	// free reports whether nothing listens on a port now (a seam: tests
	// decide what is taken).
	free func(port int) bool
}

// NewPorts allocates from [lo, hi]; lo = hi = 0 lets the kernel choose
// each port among its ephemeral ones (for tests, and nodes without a
// reserved range).
func NewPorts(lo, hi int) (*Ports, error) {
	if (lo != 0 || hi != 0) && (lo < 1 || hi > 65535 || lo > hi) {
		return nil, fmt.Errorf("port range %d-%d: want 1 <= lo <= hi <= 65535, or 0-0 for kernel-chosen ports", lo, hi)
	}
	return &Ports{lo: lo, hi: hi, next: lo, used: map[int]string{}, owners: map[string]int{}, free: free}, nil
}

// ErrNoPort is returned when every port of the range is taken.
var ErrNoPort = errors.New("no free port in the instance port range")

// Allocate gives owner a port that no other owner holds and that nothing
// on the node listens on now; an owner that holds one gets it again.
func (p *Ports) Allocate(owner string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if port, ok := p.owners[owner]; ok {
		return port, nil
	}
	if p.lo == 0 {
		for range 100 {
			port, err := kernelPort()
			if err != nil {
				return 0, err
			}
			if _, taken := p.used[port]; !taken {
				p.take(owner, port)
				return port, nil
			}
		}
		return 0, ErrNoPort
	}
	n := p.hi - p.lo + 1
	for range n {
		port := p.next
		if p.next++; p.next > p.hi {
			p.next = p.lo
		}
		if _, taken := p.used[port]; taken || !p.free(port) {
			continue
		}
		p.take(owner, port)
		return port, nil
	}
	return 0, fmt.Errorf("%w (%d-%d)", ErrNoPort, p.lo, p.hi)
}

// Reserve records that owner holds port (an instance found again after an
// agent restart).
func (p *Ports) Reserve(owner string, port int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o, taken := p.used[port]; taken && o != owner {
		return fmt.Errorf("port %d is held by instance %s", port, o)
	}
	p.take(owner, port)
	return nil
}

// Release frees owner's port.
func (p *Ports) Release(owner string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if port, ok := p.owners[owner]; ok {
		delete(p.used, port)
		delete(p.owners, owner)
	}
}

func (p *Ports) take(owner string, port int) {
	p.used[port] = owner
	p.owners[owner] = port
}

// free: nothing listens on port (on any address) now.
func free(port int) bool {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func kernelPort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("ask the kernel for a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
