package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/drover-fleet/drover/internal/clock/clocktest"
)

// t0 is the fixed clock of these tests.
var t0 = time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)

// fixedClock is a clock that stays at t0: no test steps it.
func fixedClock() *clocktest.Fake { return clocktest.New(t0) }

func openAt(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, Options{Clock: fixedClock()})
	if err != nil {
		t.Fatalf("Open(%s) = %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.db")
	return openAt(t, path), path
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestOpenCreatesAPrivateFileInANewDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "nested", "agent.db")
	s := openAt(t, path)
	fi, err := os.Stat(path)
	must(t, err)
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("mode of %s = %v, want 0600 (it holds the private key)", path, got)
	}
	v, err := s.SchemaVersion(context.Background())
	must(t, err)
	if want := mustEmbedded(t); v != len(want) {
		t.Errorf("SchemaVersion() = %d, want %d", v, len(want))
	}
	var mode string
	must(t, s.r.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	if mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
	var sync, fk int
	must(t, s.w.QueryRow(`PRAGMA synchronous`).Scan(&sync))
	must(t, s.w.QueryRow(`PRAGMA foreign_keys`).Scan(&fk))
	if sync != 2 || fk != 1 {
		t.Errorf("writer synchronous = %d, foreign_keys = %d; want 2 (FULL), 1", sync, fk)
	}
}

func TestOpenRejectsPathsThatAreNotPlainFiles(t *testing.T) {
	for _, path := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro", "a#b"} {
		_, err := Open(context.Background(), path, Options{})
		if err == nil || !strings.HasPrefix(err.Error(), "open agent db ") {
			t.Errorf("Open(%q) = %v, want an \"open agent db\" error", path, err)
		}
	}
}

func mustEmbedded(t *testing.T) []migration {
	t.Helper()
	list, err := embedded()
	must(t, err)
	return list
}

func TestIdentityIsAbsentUntilSavedAndThenReplaced(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	if _, ok, err := s.Identity(ctx); ok || err != nil {
		t.Fatalf("Identity() on a new db = ok %v, err %v; want false, nil", ok, err)
	}
	first := Identity{Node: "n1", KeyPEM: []byte("key"), CertPEM: []byte("cert"), CAPEM: []byte("ca"), Hub: "hub:443"}
	must(t, s.SaveIdentity(ctx, first))
	got, ok, err := s.Identity(ctx)
	must(t, err)
	if !ok || !reflect.DeepEqual(got, first) {
		t.Fatalf("Identity() = %+v, %v; want %+v, true", got, ok, first)
	}
	second := Identity{Node: "n1", KeyPEM: []byte("key2"), Hub: "other:443"} // nil cert and CA
	must(t, s.SaveIdentity(ctx, second))
	got, _, err = s.Identity(ctx)
	must(t, err)
	if got.Hub != "other:443" || string(got.KeyPEM) != "key2" || len(got.CertPEM) != 0 || len(got.CAPEM) != 0 {
		t.Errorf("Identity() after replace = %+v, want %+v", got, second)
	}
	if err := s.SaveIdentity(ctx, Identity{}); err == nil {
		t.Error("SaveIdentity(no node) = nil, want an error")
	}
}

func TestRevisionsStartAtZeroAndKeepAllSixtyFourBits(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	for name, get := range map[string]func(context.Context) (uint64, error){"HubRevision": s.HubRevision, "AgentRevision": s.AgentRevision} {
		if v, err := get(ctx); v != 0 || err != nil {
			t.Errorf("%s() on a new db = %d, %v; want 0, nil", name, v, err)
		}
	}
	for _, rev := range []uint64{1, 7, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64, 3} {
		must(t, s.SetHubRevision(ctx, rev))
		if got, err := s.HubRevision(ctx); got != rev || err != nil {
			t.Errorf("HubRevision() after SetHubRevision(%d) = %d, %v", rev, got, err)
		}
	}
	for want := uint64(1); want <= 3; want++ {
		if got, err := s.NextAgentRevision(ctx); got != want || err != nil {
			t.Errorf("NextAgentRevision() = %d, %v; want %d", got, err, want)
		}
	}
	if got, _ := s.AgentRevision(ctx); got != 3 {
		t.Errorf("AgentRevision() = %d, want 3", got)
	}
}

func TestPutWorkInsertsOnceAndLeavesAKnownUIDUntouched(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	w := Work{UID: "u1", Type: "noop", Spec: []byte(`{"a":1}`), Revision: 4}
	created, err := s.PutWork(ctx, w)
	if !created || err != nil {
		t.Fatalf("PutWork(new u1) = %v, %v; want true, nil", created, err)
	}
	must(t, s.SetWorkPhase(ctx, "u1", "Running", "started"))
	created, err = s.PutWork(ctx, Work{UID: "u1", Type: "other", Spec: []byte(`{}`), Revision: 9})
	if created || err != nil {
		t.Fatalf("PutWork(known u1) = %v, %v; want false, nil", created, err)
	}
	got, ok, err := s.Work(ctx, "u1")
	must(t, err)
	want := Work{UID: "u1", Type: "noop", Spec: []byte(`{"a":1}`), Phase: "Running", Reason: "started", Revision: 4, UpdatedAt: t0}
	if !ok || !workEqual(got, want) {
		t.Errorf("Work(u1) = %+v, want %+v", got, want)
	}
	if _, ok, err := s.Work(ctx, "nope"); ok || err != nil {
		t.Errorf("Work(unknown) = ok %v, err %v; want false, nil", ok, err)
	}
	if _, err := s.PutWork(ctx, Work{}); err == nil {
		t.Error("PutWork(empty uid) = nil error, want one")
	}
}

func workEqual(a, b Work) bool {
	at, bt := a.UpdatedAt, b.UpdatedAt
	a.UpdatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	if len(a.Spec) == 0 && len(b.Spec) == 0 {
		a.Spec, b.Spec = nil, nil
	}
	return at.Equal(bt) && reflect.DeepEqual(a, b)
}

func uids(ws []Work) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.UID)
	}
	return out
}

func TestSetWorkPhaseAndDeleteWork(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	err := s.SetWorkPhase(ctx, "ghost", "Running", "")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "ghost") {
		t.Errorf("SetWorkPhase(unknown) = %v, want ErrNotFound naming the uid", err)
	}
	_, err = s.PutWork(ctx, Work{UID: "u1", Type: "noop"})
	must(t, err)
	must(t, s.DeleteWork(ctx, "u1"))
	must(t, s.DeleteWork(ctx, "u1")) // no-op the second time
	if _, ok, _ := s.Work(ctx, "u1"); ok {
		t.Error("Work(u1) after DeleteWork: still there")
	}
}

func TestListWorkIsInDeliveryOrder(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	for _, uid := range []string{"c", "a", "b"} {
		_, err := s.PutWork(ctx, Work{UID: uid, Type: "noop"})
		must(t, err)
	}
	must(t, s.DeleteWork(ctx, "a"))
	_, err := s.PutWork(ctx, Work{UID: "a", Type: "noop"})
	must(t, err)
	list, err := s.ListWork(ctx)
	must(t, err)
	if got, want := uids(list), []string{"c", "b", "a"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ListWork() = %v, want %v", got, want)
	}
}

func TestApplySnapshotInsertsUnknownKeepsKnownAndReportsTheRest(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	for _, uid := range []string{"keep", "gone1", "gone2"} {
		_, err := s.ApplyDispatch(ctx, 1, Work{UID: uid, Type: "noop"})
		must(t, err)
	}
	must(t, s.SetWorkPhase(ctx, "keep", "Running", ""))
	must(t, s.SetWorkPhase(ctx, "gone2", "Succeeded", ""))

	removed, err := s.ApplySnapshot(ctx, 10, []Work{
		{UID: "new", Type: "task", Spec: []byte("{}"), Revision: 99}, // Revision is overridden by rev
		{UID: "keep", Type: "changed"},
	})
	must(t, err)
	if want := []string{"gone1", "gone2"}; !reflect.DeepEqual(removed, want) {
		t.Errorf("ApplySnapshot removed = %v, want %v", removed, want)
	}
	if rev, _ := s.HubRevision(ctx); rev != 10 {
		t.Errorf("HubRevision() after snapshot = %d, want 10", rev)
	}
	keep, _, _ := s.Work(ctx, "keep")
	if keep.Type != "noop" || keep.Phase != "Running" || keep.Revision != 1 {
		t.Errorf("known item after snapshot = %+v, want it untouched", keep)
	}
	nw, ok, _ := s.Work(ctx, "new")
	if !ok || nw.Revision != 10 || nw.Type != "task" {
		t.Errorf("new item after snapshot = %+v, %v; want type task at revision 10", nw, ok)
	}
	// The removed items are reported, not deleted: the caller cancels them.
	list, _ := s.ListWork(ctx)
	if got, want := uids(list), []string{"keep", "gone1", "gone2", "new"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ListWork() after snapshot = %v, want %v", got, want)
	}

	removed, err = s.ApplySnapshot(ctx, 11, nil)
	must(t, err)
	if want := []string{"keep", "gone1", "gone2", "new"}; !reflect.DeepEqual(removed, want) {
		t.Errorf("empty snapshot removed = %v, want %v", removed, want)
	}
}

func TestApplySnapshotIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	must(t, s.SetHubRevision(ctx, 5))
	_, err := s.ApplySnapshot(ctx, 6, []Work{{UID: "a", Type: "noop"}, {UID: "", Type: "noop"}})
	if err == nil {
		t.Fatal("ApplySnapshot with an empty uid = nil error")
	}
	if rev, _ := s.HubRevision(ctx); rev != 5 {
		t.Errorf("HubRevision() after a failed snapshot = %d, want 5", rev)
	}
	if list, _ := s.ListWork(ctx); len(list) != 0 {
		t.Errorf("ListWork() after a failed snapshot = %v, want none", uids(list))
	}

	// A failure inside the transaction (cancelled context) rolls back too.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.ApplySnapshot(cctx, 7, []Work{{UID: "b", Type: "noop"}}); err == nil {
		t.Fatal("ApplySnapshot(cancelled ctx) = nil error")
	}
	if rev, _ := s.HubRevision(ctx); rev != 5 {
		t.Errorf("HubRevision() after a cancelled snapshot = %d, want 5", rev)
	}
}

func TestApplyDispatchMovesTheRevisionEvenForAKnownUID(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	created, err := s.ApplyDispatch(ctx, 1, Work{UID: "u", Type: "noop"})
	if !created || err != nil {
		t.Fatalf("ApplyDispatch(1, new) = %v, %v", created, err)
	}
	created, err = s.ApplyDispatch(ctx, 2, Work{UID: "u", Type: "noop"})
	if created || err != nil {
		t.Fatalf("ApplyDispatch(2, known) = %v, %v; want false, nil", created, err)
	}
	if rev, _ := s.HubRevision(ctx); rev != 2 {
		t.Errorf("HubRevision() = %d, want 2", rev)
	}
	w, _, _ := s.Work(ctx, "u")
	if w.Revision != 1 {
		t.Errorf("Work(u).Revision = %d, want 1 (the delivering revision)", w.Revision)
	}
}

func TestApplyDispatchesIsOneTransaction(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	if _, err := s.ApplyDispatch(ctx, 1, Work{UID: "known", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	created, err := s.ApplyDispatches(ctx, []Work{
		{UID: "a", Type: "noop", Revision: 2},
		{UID: "known", Type: "noop", Revision: 3},
		{UID: "b", Type: "noop", Revision: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, true}; !slices.Equal(created, want) {
		t.Errorf("created = %v, want %v", created, want)
	}
	if rev, _ := s.HubRevision(ctx); rev != 4 {
		t.Errorf("HubRevision() = %d, want 4", rev)
	}
	if w, _, _ := s.Work(ctx, "b"); w.Revision != 4 {
		t.Errorf("Work(b).Revision = %d, want 4", w.Revision)
	}

	// Revisions out of order are refused before anything is written, and a
	// failure inside the transaction leaves nothing of the run behind.
	if _, err := s.ApplyDispatches(ctx, []Work{{UID: "c", Revision: 6}, {UID: "d", Revision: 5}}); err == nil {
		t.Error("ApplyDispatches(revisions 6, 5) = nil error")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.ApplyDispatches(cctx, []Work{{UID: "c", Revision: 5}, {UID: "d", Revision: 6}}); err == nil {
		t.Fatal("ApplyDispatches(cancelled ctx) = nil error")
	}
	for _, uid := range []string{"c", "d"} {
		if _, ok, _ := s.Work(ctx, uid); ok {
			t.Errorf("work %s exists after failed runs", uid)
		}
	}
	if rev, _ := s.HubRevision(ctx); rev != 4 {
		t.Errorf("HubRevision() after failed runs = %d, want 4", rev)
	}
}

func TestReportIsOneTransaction(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	if _, err := s.PutWork(ctx, Work{UID: "u", Type: "noop", Phase: "Running"}); err != nil {
		t.Fatal(err)
	}
	msg := func(rev uint64) (string, []byte, error) { return fmt.Sprintf("m%d", rev), []byte("r"), nil }
	rev, err := s.Report(ctx, "u", "Succeeded", "done", msg)
	if err != nil || rev != 1 {
		t.Fatalf("Report(u) = %d, %v; want revision 1", rev, err)
	}
	if w, _, _ := s.Work(ctx, "u"); w.Phase != "Succeeded" || w.Reason != "done" {
		t.Errorf("work u = %s/%s, want Succeeded/done", w.Phase, w.Reason)
	}
	if rev, err = s.Report(ctx, "", "", "", msg); err != nil || rev != 2 {
		t.Fatalf("Report(node state) = %d, %v; want revision 2", rev, err)
	}
	// A failure anywhere leaves nothing: not the phase, the revision, nor a message.
	if _, err := s.Report(ctx, "gone", "Failed", "", msg); !errors.Is(err, ErrNotFound) {
		t.Errorf("Report(unknown uid) = %v, want ErrNotFound", err)
	}
	if _, err := s.Report(ctx, "u", "Failed", "x", func(uint64) (string, []byte, error) { return "", nil, errors.New("cannot encode") }); err == nil {
		t.Error("Report(build fails) = nil error")
	}
	if w, _, _ := s.Work(ctx, "u"); w.Phase != "Succeeded" {
		t.Errorf("work u = %s after a failed report, want Succeeded", w.Phase)
	}
	if rev, _ := s.AgentRevision(ctx); rev != 2 {
		t.Errorf("AgentRevision() = %d after failed reports, want 2", rev)
	}
	pending, _ := s.Pending(ctx, 0)
	var ids []string
	for _, m := range pending {
		ids = append(ids, m.ID)
	}
	if want := []string{"m1", "m2"}; !slices.Equal(ids, want) {
		t.Errorf("outbox %v, want %v", ids, want)
	}
	// A runner's record and its report are one transaction too.
	if _, err := s.ReportAction(ctx, Action{UID: "u", Action: "Exec", State: ActionRunning, Data: []byte("pid")}, msg); err != nil {
		t.Fatal(err)
	}
	if acts, _ := s.Actions(ctx, "u"); len(acts) != 1 || acts[0].State != ActionRunning || string(acts[0].Data) != "pid" {
		t.Errorf("actions of u = %+v, want the Exec record", acts)
	}
	if _, err := s.ReportAction(ctx, Action{UID: "u", Action: "Exec", State: ActionSucceeded}, func(uint64) (string, []byte, error) { return "", nil, errors.New("cannot encode") }); err == nil {
		t.Error("ReportAction(build fails) = nil error")
	}
	if acts, _ := s.Actions(ctx, "u"); len(acts) != 1 || acts[0].State != ActionRunning {
		t.Errorf("actions of u after a failed report = %+v, want it Running still", acts)
	}
	must(t, s.Ack(ctx, "m3"))
	must(t, s.MarkAttempt(ctx, "m1", "m2", "unknown"))
	must(t, s.Ack(ctx, "m1", "m2", "unknown"))
	if pending, _ := s.Pending(ctx, 0); len(pending) != 0 {
		t.Errorf("outbox after acking all = %v, want empty", pending)
	}
}

func TestOutboxKeepsOrderIgnoresRepeatsAndForgetsAcked(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	for _, id := range []string{"m2", "m1", "m3"} {
		must(t, s.Enqueue(ctx, id, []byte("data-"+id)))
	}
	must(t, s.Enqueue(ctx, "m2", []byte("other"))) // no-op
	must(t, s.MarkAttempt(ctx, "m1"))
	must(t, s.MarkAttempt(ctx, "m1"))
	must(t, s.MarkAttempt(ctx, "unknown"))

	all, err := s.Pending(ctx, 0)
	must(t, err)
	want := []OutMsg{
		{ID: "m2", Data: []byte("data-m2"), CreatedAt: t0},
		{ID: "m1", Data: []byte("data-m1"), CreatedAt: t0, Attempts: 2},
		{ID: "m3", Data: []byte("data-m3"), CreatedAt: t0},
	}
	if len(all) != len(want) {
		t.Fatalf("Pending(0) = %d messages, want %d", len(all), len(want))
	}
	for i := range want {
		if all[i].ID != want[i].ID || string(all[i].Data) != string(want[i].Data) ||
			!all[i].CreatedAt.Equal(want[i].CreatedAt) || all[i].Attempts != want[i].Attempts {
			t.Errorf("Pending(0)[%d] = %+v, want %+v", i, all[i], want[i])
		}
	}
	two, _ := s.Pending(ctx, 2)
	if len(two) != 2 || two[0].ID != "m2" || two[1].ID != "m1" {
		t.Errorf("Pending(2) = %v, want m2, m1", two)
	}
	must(t, s.Ack(ctx, "m2"))
	must(t, s.Ack(ctx, "m2")) // repeat: no-op
	must(t, s.Ack(ctx, "never"))
	rest, _ := s.Pending(ctx, 10)
	if len(rest) != 2 || rest[0].ID != "m1" {
		t.Errorf("Pending(10) after Ack(m2) = %v, want m1, m3", rest)
	}
	if err := s.Enqueue(ctx, "", nil); err == nil {
		t.Error("Enqueue(empty id) = nil error")
	}
}

// fill writes one of everything.
func fill(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	must(t, s.SaveIdentity(ctx, Identity{Node: "n1", KeyPEM: []byte("k"), CertPEM: []byte("c"), CAPEM: []byte("ca"), Hub: "h:1"}))
	_, err := s.ApplySnapshot(ctx, 3, []Work{{UID: "a", Type: "noop", Spec: []byte("{}")}})
	must(t, err)
	_, err = s.ApplyDispatch(ctx, 4, Work{UID: "b", Type: "task"})
	must(t, err)
	must(t, s.SetWorkPhase(ctx, "a", "Running", "go"))
	_, err = s.NextAgentRevision(ctx)
	must(t, err)
	_, err = s.NextAgentRevision(ctx)
	must(t, err)
	must(t, s.Enqueue(ctx, "m1", []byte("x")))
	must(t, s.MarkAttempt(ctx, "m1"))
}

// check asserts what fill wrote.
func check(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	id, ok, err := s.Identity(ctx)
	if err != nil || !ok || id.Node != "n1" || string(id.CAPEM) != "ca" || id.Hub != "h:1" {
		t.Errorf("Identity() = %+v, %v, %v", id, ok, err)
	}
	if rev, err := s.HubRevision(ctx); rev != 4 || err != nil {
		t.Errorf("HubRevision() = %d, %v; want 4", rev, err)
	}
	if rev, err := s.AgentRevision(ctx); rev != 2 || err != nil {
		t.Errorf("AgentRevision() = %d, %v; want 2", rev, err)
	}
	list, err := s.ListWork(ctx)
	must(t, err)
	if len(list) != 2 || list[0].UID != "a" || list[0].Phase != "Running" || list[1].UID != "b" || list[1].Revision != 4 {
		t.Errorf("ListWork() = %+v", list)
	}
	out, err := s.Pending(ctx, 0)
	must(t, err)
	if len(out) != 1 || out[0].ID != "m1" || out[0].Attempts != 1 {
		t.Errorf("Pending() = %+v", out)
	}
}

func TestReopenKeepsIdentityRevisionsWorkAndOutbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	s, err := Open(context.Background(), path, Options{Clock: fixedClock()})
	must(t, err)
	fill(t, s)
	must(t, s.Close())
	check(t, openAt(t, path))
}

// TestACrashLosesNoCommittedWrite copies the database files while the store
// is still open, as a kill -9 or power cut would leave them: the WAL is not
// checkpointed and no Close has run. The copy must open with everything.
func TestACrashLosesNoCommittedWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.db")
	s := openAt(t, path)
	fill(t, s)
	wal, err := os.Stat(path + "-wal")
	if err != nil || wal.Size() == 0 {
		t.Fatalf("want a non-empty WAL before the crash, got %v, %v", wal, err)
	}

	crashed := filepath.Join(t.TempDir(), "agent.db")
	for _, suffix := range []string{"", "-wal", "-shm"} {
		copyFile(t, path+suffix, crashed+suffix)
	}
	check(t, openAt(t, crashed))

	// A second Open of the very same files, with the first never closed,
	// must see the same state too.
	check(t, openAt(t, path))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	must(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	must(t, err)
	_, err = io.Copy(out, in)
	must(t, err)
	must(t, out.Close())
}

// TestConcurrentWritersDoNotGetBusy hammers one store from several goroutines
// and a second store on the same file (as a second process would), with reads
// in between. No call may fail with SQLITE_BUSY or anything else.
func TestConcurrentWritersDoNotGetBusy(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	other := openAt(t, path)
	const goroutines, ops = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*ops)
	for g := range goroutines {
		st := s
		if g%2 == 1 {
			st = other
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ops {
				uid := fmt.Sprintf("g%d-%d", g, i)
				var err error
				switch i % 5 {
				case 0:
					_, err = st.ApplyDispatch(ctx, uint64(i+1), Work{UID: uid, Type: "noop"})
				case 1:
					_, err = st.NextAgentRevision(ctx)
				case 2:
					err = st.Enqueue(ctx, uid, []byte(uid))
				case 3:
					_, err = st.ApplySnapshot(ctx, uint64(i), []Work{{UID: uid, Type: "noop"}})
				case 4:
					_, err = st.ListWork(ctx)
				}
				if err != nil {
					errs <- fmt.Errorf("goroutine %d op %d: %w", g, i, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if rev, _ := s.AgentRevision(ctx); rev != goroutines*ops/5 {
		t.Errorf("AgentRevision() = %d, want %d (one per NextAgentRevision call)", rev, goroutines*ops/5)
	}
}

func TestADatabaseFromANewerBinaryIsRefused(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	_, err := s.w.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)`)
	must(t, err)
	must(t, s.Close())

	_, err = Open(ctx, path, Options{})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open(db at version 99) = %v, want ErrSchemaTooNew", err)
	}
	for _, want := range []string{"open agent db " + path, "schema version 99", fmt.Sprintf("up to %d", len(mustEmbedded(t)))} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(db at version 99) = %q, want it to mention %q", err, want)
		}
	}
}

func TestMigrationsApplyInOrderEachInItsOwnTransaction(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	base := mustEmbedded(t)
	broken := append(cloneMigrations(base), migration{
		version: len(base) + 1, name: "broken",
		sql: `CREATE TABLE half (x INTEGER); INSERT INTO nosuchtable VALUES (1);`,
	})
	_, err := open(ctx, path, Options{}, func() ([]migration, error) { return broken, nil })
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("migration %04d_broken", len(base)+1)) {
		t.Fatalf("open with a broken migration = %v, want it named", err)
	}
	// The good migrations stayed; the broken one left nothing behind.
	s := openAt(t, path)
	if v, _ := s.SchemaVersion(ctx); v != len(base) {
		t.Errorf("SchemaVersion() after a failed migration = %d, want %d", v, len(base))
	}
	var n int
	must(t, s.r.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = 'half'`).Scan(&n))
	if n != 0 {
		t.Error("table created by the failed migration survived its rollback")
	}
	must(t, s.Close())

	fixed := append(cloneMigrations(base), migration{version: len(base) + 1, name: "fixed", sql: `CREATE TABLE half (x INTEGER);`})
	s2, err := open(ctx, path, Options{}, func() ([]migration, error) { return fixed, nil })
	must(t, err)
	defer s2.Close()
	if v, _ := s2.SchemaVersion(ctx); v != len(base)+1 {
		t.Errorf("SchemaVersion() after the fixed migration = %d, want %d", v, len(base)+1)
	}
}

func cloneMigrations(m []migration) []migration { return append([]migration(nil), m...) }

func TestLoadMigrationsWantsNumberedFilesWithoutHoles(t *testing.T) {
	sqlFile := &fstest.MapFile{Data: []byte("SELECT 1;")}
	tests := []struct {
		name  string
		files fstest.MapFS
		err   string
	}{
		{"consecutive versions load", fstest.MapFS{"m/0001_a.sql": sqlFile, "m/0002_b.sql": sqlFile}, ""},
		{"a hole is refused", fstest.MapFS{"m/0001_a.sql": sqlFile, "m/0003_c.sql": sqlFile}, "version 3, want 2"},
		{"not starting at 1 is refused", fstest.MapFS{"m/0002_b.sql": sqlFile}, "version 2, want 1"},
		{"a repeated version is refused", fstest.MapFS{"m/0001_a.sql": sqlFile, "m/0001_b.sql": sqlFile}, "version 1, want 2"},
		{"a badly named file is refused", fstest.MapFS{"m/1_a.sql": sqlFile}, "want NNNN_name.sql"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			list, err := loadMigrations(tt.files, "m")
			if tt.err == "" {
				if err != nil || len(list) != 2 || list[1].name != "b" {
					t.Errorf("loadMigrations() = %v, %v", list, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("loadMigrations() = %v, want an error containing %q", err, tt.err)
			}
		})
	}
}

func TestEmbeddedMigrationsLoad(t *testing.T) {
	if list := mustEmbedded(t); len(list) == 0 || list[0].name != "init" {
		t.Errorf("embedded() = %v, want 0001_init first", list)
	}
}

func TestOpenLogsEachMigrationOnce(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	path := filepath.Join(t.TempDir(), "agent.db")
	for range 2 {
		s, err := Open(context.Background(), path, Options{Logger: log})
		must(t, err)
		must(t, s.Close())
	}
	if got := strings.Count(buf.String(), "applied agent db migration"); got != len(mustEmbedded(t)) {
		t.Errorf("migration log lines = %d, want %d:\n%s", got, len(mustEmbedded(t)), buf.String())
	}
}

func TestCallsAfterCloseFailCleanly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	s, err := Open(context.Background(), path, Options{})
	must(t, err)
	must(t, s.Close())
	if _, err := s.HubRevision(context.Background()); err == nil {
		t.Error("HubRevision() after Close = nil error")
	}
	if _, err := s.PutWork(context.Background(), Work{UID: "u"}); err == nil {
		t.Error("PutWork() after Close = nil error")
	}
}
