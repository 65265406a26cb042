package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// Credentials in work specs (a node job's registry logins, from the job's
// Secret) never reach the agent DB: the DB is a file on the node, and what
// a file holds outlives the work, leaks into backups, and is one mistake of
// permissions away from a task. The agent stores such a spec without its
// "auth" (and with redactedKey, so the runner knows something is missing),
// keeps the spec as delivered in memory while the item may still run, and
// drops it when the item ends or the hub drops it.
//
// A restarted agent has lost them. It does not pull anonymously instead: a
// runner that finds its spec redacted and nothing in memory waits for the
// first snapshot of this process (the hub sends one on every new stream,
// with every item's spec, credentials included: agent protocol D2), and
// fails with a message saying so if even that did not bring them.

// redactedKey marks a stored spec whose credentials were removed. Specs of
// node jobs ignore fields they do not know.
const redactedKey = "droverAgentCredentialsInMemory"

// credentialTypes are the work types whose specs carry credentials under
// "auth" (nodejobwire.PrePullSpec.Auth, UpgradeSpec.Auth).
var credentialTypes = map[string]bool{nodejobwire.TypePrePull: true, nodejobwire.TypeUpgrade: true}

// redact returns the spec to store: spec without its credentials and
// marked, with secret true, or spec itself when it holds none. A spec of
// such a type that is not a JSON object is stored as a bare mark (it may
// hold anything; its runner gets it from memory and says what is wrong).
func redact(typ string, spec []byte) (stored []byte, secret bool) {
	if !credentialTypes[typ] {
		return spec, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(spec, &m); err != nil || m == nil {
		return []byte(`{"` + redactedKey + `":true}`), true
	}
	auth, ok := m["auth"]
	if !ok || bytes.Equal(auth, []byte("null")) || bytes.Equal(bytes.TrimSpace(auth), []byte("{}")) {
		return spec, false
	}
	delete(m, "auth")
	m[redactedKey] = json.RawMessage("true")
	b, err := json.Marshal(m)
	if err != nil {
		return []byte(`{"` + redactedKey + `":true}`), true
	}
	return b, true
}

// isRedacted reports whether a stored spec lost its credentials to redact.
func isRedacted(spec []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(spec, &m) != nil {
		return false
	}
	_, ok := m[redactedKey]
	return ok
}

// heldSpecs are the delivered specs with credentials, in memory only, by
// work uid. The zero value is ready.
type heldSpecs struct {
	mu     sync.Mutex
	specs  map[string][]byte
	synced chan struct{} // closed once a snapshot was applied in this process
}

// keep returns the spec of item uid to store, holding the delivered one
// when it carries credentials.
func (h *heldSpecs) keep(uid, typ string, spec []byte) []byte {
	stored, secret := redact(typ, spec)
	if secret {
		h.mu.Lock()
		if h.specs == nil {
			h.specs = map[string][]byte{}
		}
		h.specs[uid] = bytes.Clone(spec)
		h.mu.Unlock()
	}
	return stored
}

// drop forgets uid's credentials: its item ended or the hub dropped it.
func (h *heldSpecs) drop(uid string) {
	h.mu.Lock()
	delete(h.specs, uid)
	h.mu.Unlock()
}

// held reports whether uid's credentials are in memory.
func (h *heldSpecs) held(uid string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.specs[uid]
	return ok
}

func (h *heldSpecs) syncedChan() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.synced == nil {
		h.synced = make(chan struct{})
	}
	return h.synced
}

// snapshotApplied records that the hub's view, with every item's spec, has
// reached this process.
func (h *heldSpecs) snapshotApplied() {
	ch := h.syncedChan()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// spec is the spec item uid runs with: stored itself, or, when stored was
// redacted, the delivered one from memory, waiting for this process's
// first snapshot if need be (until ctx ends).
func (h *heldSpecs) spec(ctx context.Context, uid string, stored []byte) ([]byte, error) {
	if !isRedacted(stored) {
		return stored, nil
	}
	for waited := false; ; waited = true {
		h.mu.Lock()
		s, ok := h.specs[uid]
		h.mu.Unlock()
		if ok {
			return s, nil
		}
		if waited {
			return nil, errors.New("the work's registry credentials are kept in memory only, and the agent restarted since they came; " +
				"the hub's snapshot after the restart did not bring them again (is the job's imageSecretRef still there?), " +
				"so the agent does not go on without them")
		}
		select {
		case <-h.syncedChan():
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the hub to send the work's credentials again after an agent restart: %w", context.Cause(ctx))
		}
	}
}

// withCredentials runs a node job flow with the spec as delivered, its
// credentials from memory, and drops them when the flow returns.
func (a *Agent) withCredentials(run flowRunner) flowRunner {
	return func(ctx context.Context, uid string, stored []byte, report reportFunc) (string, string) {
		defer a.held.drop(uid)
		spec, err := a.held.spec(ctx, uid, stored)
		if err != nil {
			return PhaseFailed, err.Error()
		}
		return run(ctx, uid, spec, report)
	}
}

// forgetEndedCredentials drops the credentials a snapshot brought for
// items that have ended already (the hub lists them until their job is
// done): only an item that may still run needs them.
func (a *Agent) forgetEndedCredentials(ctx context.Context, uids []string) error {
	for _, uid := range uids {
		w, ok, err := a.db.Work(ctx, uid)
		if err != nil {
			return err
		}
		if !ok || (w.Phase != "" && w.Phase != PhasePending && w.Phase != PhaseRunning) {
			a.held.drop(uid)
		}
	}
	return nil
}

// scrubStoredCredentials removes the credentials an older agent stored
// with its items' specs, from the items that may still run (their runner
// then waits for the hub to send them again). Ended items keep theirs
// until the hub drops them and the agent deletes them.
func (a *Agent) scrubStoredCredentials(ctx context.Context) error {
	ws, err := a.db.ListWork(ctx)
	if err != nil {
		return err
	}
	for _, w := range ws {
		stored, secret := redact(w.Type, w.Spec)
		if !secret || terminal(w.Phase) || isRedacted(w.Spec) {
			continue
		}
		if _, err := a.db.SetWorkSpec(ctx, w.UID, stored); err != nil {
			return fmt.Errorf("remove the stored credentials of work %s: %w", w.UID, err)
		}
		a.log.Info("removed registry credentials an earlier agent stored with a work item; the hub sends them again", "uid", w.UID)
	}
	return nil
}
