package tenancyadmit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/tenancy"
)

// policyCache holds the NodeGrants compiled, until one changes: a
// FleetJob of thousands of tasks makes as many Task admissions, which
// must not compile every grant each.
type policyCache struct {
	cache client.Reader // the manager's cache, where NodeGrants are watched
	api   client.Reader
	log   *slog.Logger

	mu     sync.Mutex
	gen    uint64 // bumped by every NodeGrant event
	policy *tenancy.Policy
	of     uint64 // the gen policy was compiled at
}

// invalidate is called on every NodeGrant add, update and delete, after
// the cache holds the change.
func (c *policyCache) invalidate() {
	c.mu.Lock()
	c.gen++
	c.mu.Unlock()
}

// get returns the policy of the cached grants.
func (c *policyCache) get(ctx context.Context) (*tenancy.Policy, error) {
	c.mu.Lock()
	gen, p := c.gen, c.policy
	if p != nil && c.of == gen {
		c.mu.Unlock()
		return p, nil
	}
	c.mu.Unlock()
	p, errs, err := c.compile(ctx, c.cache)
	if err != nil {
		return nil, err
	}
	for _, err := range errs {
		// Such a grant grants nothing. Logged once per change of the
		// grants, when they are compiled for the cache.
		c.log.Error("NodeGrant ignored", "err", err)
	}
	c.mu.Lock()
	// A grant that changed while this one compiled makes it stale: the
	// next request compiles again.
	if c.gen == gen {
		c.policy, c.of = p, gen
	}
	c.mu.Unlock()
	return p, nil
}

// fresh returns the policy of the API server's grants, bypassing the cache.
func (c *policyCache) fresh(ctx context.Context) (*tenancy.Policy, error) {
	p, _, err := c.compile(ctx, c.api)
	return p, err
}

// compile returns the policy of the grants r lists, and the grants that
// grant nothing as they do not parse.
func (c *policyCache) compile(ctx context.Context, r client.Reader) (*tenancy.Policy, []error, error) {
	var l fleetv1.NodeGrantList
	if err := r.List(ctx, &l); err != nil {
		return nil, nil, fmt.Errorf("list NodeGrants: %w", err)
	}
	p, errs := tenancy.Compile(l.Items)
	return p, errs, nil
}
