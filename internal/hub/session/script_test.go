package session

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.txt with the output the Machine gives now; read the diff before committing it")

// TestScripts replays the scripts in testdata. A script is a list of
// blocks, each a command, a line "----" and the output it must print,
// ended by an empty line; lines starting with # are comments:
//
//	new hub=10 queue=3 batch
//	----
//	rev 10, agent rev 0, batching
//
//	dispatch a b
//	----
//	DISPATCH@11 e1 [a]: queued
//	DISPATCH@12 e2 [b]: queued
//
// Envelope ids are e1, e2, ... in the order the Machine builds them. The
// commands are those of (*script).run. With -update the outputs are
// rewritten from what the Machine does now.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			out, mismatches := runScript(t, string(b))
			if *update {
				if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, m := range mismatches {
				t.Errorf("%s:%s", file, m)
			}
		})
	}
}

// runScript executes a script and returns it with the actual outputs, plus
// a message for each block whose output differs.
func runScript(t *testing.T, text string) (string, []string) {
	t.Helper()
	var (
		out        strings.Builder
		mismatches []string
		s          = &script{}
	)
	s.reset(Config{})
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		cmd, at := line, i+1
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("line %d: %q is not followed by ----", at, cmd)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		got := s.run(t, at, cmd)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			mismatches = append(mismatches, fmt.Sprintf("%d: %s\ngot:\n\t%s\nwant:\n\t%s", at, cmd,
				strings.Join(got, "\n\t"), strings.Join(want, "\n\t")))
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n", cmd, strings.Join(got, "\n"))
		if i < len(lines) {
			out.WriteString("\n")
		}
	}
	return out.String(), mismatches
}

// script is the state of a running script: the Machine, the envelope ids
// it made, and the snapshots being built, by name.
type script struct {
	m      *Machine
	ids    int
	builds map[string]Build
}

func (s *script) reset(cfg Config) {
	s.ids = 0
	cfg.Node = "n1"
	cfg.NewID = s.newID
	s.m = New(cfg)
	s.builds = map[string]Build{}
}

func (s *script) newID() string {
	s.ids++
	return fmt.Sprint("e", s.ids)
}

// run executes one command and returns what it prints. The commands:
//
//	new [hub=REV] [agent=REV] [queue=N] [seen=N] [batch]   a new Machine
//	dispatch ITEM...      ITEM is a uid, uid:NNk for a spec of NN KiB, or
//	                      PREFIX*N for N of them (first and last printed)
//	cancel UID...
//	log                   queue a log request (no revision)
//	push REV UID          queue a hand-made Dispatch at REV
//	begin NAME            BeginSnapshot
//	end NAME [have=REV] [ITEM...]  EndSnapshot of the listed items
//	abort NAME            AbortSnapshot
//	next                  one Next
//	drain                 Next until it does not say send
//	ack ID...             Ack, then the pending envelopes
//	received ID           Received
//	status REV...         Status, one verdict each
//	nodestate REV         NodeState
//	close REASON
//	show                  the Machine's state
func (s *script) run(t *testing.T, line int, cmd string) []string {
	t.Helper()
	f := strings.Fields(cmd)
	args := f[1:]
	fail := func(format string, a ...any) []string {
		t.Fatalf("line %d: %s: %s", line, cmd, fmt.Sprintf(format, a...))
		return nil
	}
	num := func(s string) uint64 {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			fail("%v", err)
		}
		return n
	}
	var out []string
	switch f[0] {
	case "new":
		var cfg Config
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			switch k {
			case "hub":
				cfg.HubRevision = num(v)
			case "agent":
				cfg.AgentRevision = num(v)
			case "queue":
				cfg.QueueLimit = int(num(v))
			case "seen":
				cfg.SeenLimit = int(num(v))
			case "batch":
				cfg.Batching = true
			default:
				fail("unknown option %q", a)
			}
		}
		s.reset(cfg)
		desc := fmt.Sprintf("rev %d, agent rev %d", s.m.Revision(), s.m.AgentRevision())
		if s.m.Batching() {
			desc += ", batching"
		}
		out = append(out, desc)
	case "dispatch":
		for _, a := range args {
			if prefix, n, many := strings.Cut(a, "*"); many {
				// PREFIX*N: N dispatches, PREFIX0 on; the first and last shown.
				var lines []string
				for i := range num(n) {
					lines = append(lines, taken(s.m.Dispatch(&agentv1.WorkItem{Uid: fmt.Sprint(prefix, i), Type: "noop"})))
				}
				out = append(out, lines[0])
				if len(lines) > 1 {
					out = append(out, fmt.Sprintf("... %d more ...", len(lines)-2), lines[len(lines)-1])
				}
				continue
			}
			out = append(out, taken(s.m.Dispatch(s.item(a))))
		}
	case "cancel":
		for _, uid := range args {
			out = append(out, taken(s.m.Cancel(uid)))
		}
	case "log":
		env := protocol.NewLogRequest("n1", &agentv1.LogRequest{RequestId: "r", Uid: "w", Stream: "stdout"})
		env.Id = s.newID()
		out = append(out, result(describe(env), s.m.Send(env)))
	case "push":
		if len(args) != 2 {
			fail("want push REV UID")
		}
		env := protocol.NewDispatch("n1", num(args[0]), &agentv1.WorkItem{Uid: args[1], Type: "noop"})
		env.Id = s.newID()
		out = append(out, result(describe(env), s.m.Push(env)))
	case "begin":
		b := s.m.BeginSnapshot()
		s.builds[args[0]] = b
		desc := fmt.Sprintf("build %s: changes after rev %d", args[0], b.mark)
		if b.Resync {
			desc += ", resync"
		}
		out = append(out, desc)
	case "end":
		b, ok := s.builds[args[0]]
		if !ok {
			fail("no build %q", args[0])
		}
		delete(s.builds, args[0])
		var have uint64
		var items []*agentv1.WorkItem
		for _, a := range args[1:] {
			if v, ok := strings.CutPrefix(a, "have="); ok {
				have = num(v)
				continue
			}
			items = append(items, s.item(a))
		}
		env, err := s.m.EndSnapshot(b, items, have)
		out = append(out, result(describe(env), err))
	case "abort":
		s.m.AbortSnapshot(s.builds[args[0]])
		delete(s.builds, args[0])
		out = append(out, "aborted")
	case "next":
		out = append(out, next(s.m))
	case "drain":
		for {
			l := next(s.m)
			out = append(out, l)
			if !strings.HasPrefix(l, "send ") {
				break
			}
		}
	case "ack":
		s.m.Ack(args[0], args[1:]...)
		out = append(out, "pending: "+pending(s.m))
	case "received":
		if s.m.Received(args[0]) {
			out = append(out, "new")
		} else {
			out = append(out, "duplicate")
		}
	case "status":
		for _, a := range args {
			v := s.m.Status(num(a))
			out = append(out, fmt.Sprintf("rev %s: %v (agent rev %d)", a, v, s.m.AgentRevision()))
		}
	case "nodestate":
		v := s.m.NodeState(num(args[0]))
		out = append(out, fmt.Sprintf("rev %s: %v (agent rev %d)", args[0], v, s.m.AgentRevision()))
	case "close":
		if s.m.Close(strings.Join(args, " ")) {
			out = append(out, "closed")
		} else {
			out = append(out, "already closed: "+s.m.Reason())
		}
	case "show":
		out = show(s.m)
	default:
		fail("unknown command")
	}
	return out
}

// item is the work item a script names: uid, or uid:NNk for a spec of NN
// KiB.
func (s *script) item(a string) *agentv1.WorkItem {
	uid, size, big := strings.Cut(a, ":")
	it := &agentv1.WorkItem{Uid: uid, Type: "noop"}
	if big {
		n, err := strconv.Atoi(strings.TrimSuffix(size, "k"))
		if err != nil {
			panic(fmt.Sprintf("item %q: %v", a, err))
		}
		it.Spec = make([]byte, n<<10)
	}
	return it
}

func taken(env *agentv1.Envelope, o Outcome, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return describe(env) + ": " + o.String()
}

func result(desc string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return desc
}

func next(m *Machine) string {
	a, env := m.Next()
	switch a {
	case Send:
		return "send " + describe(env)
	case Closed:
		return "closed: " + m.Reason()
	default:
		return a.String()
	}
}

// describe is env as KIND@REV ID and its items (a Dispatch's, a
// Snapshot's) or uid (a Cancel's).
func describe(env *agentv1.Envelope) string {
	if env == nil {
		return "<nil>"
	}
	d := strings.TrimPrefix(env.GetKind().String(), "KIND_")
	if env.GetRevision() != 0 {
		d += fmt.Sprint("@", env.GetRevision())
	}
	d += " " + env.GetId()
	var items []*agentv1.WorkItem
	switch p := env.GetPayload().(type) {
	case *agentv1.Envelope_Dispatch:
		items = protocol.DispatchItems(p.Dispatch)
	case *agentv1.Envelope_Snapshot:
		items = p.Snapshot.GetItems()
	case *agentv1.Envelope_Cancel:
		return d + " " + p.Cancel.GetUid()
	default:
		return d
	}
	var uids []string
	for _, it := range items {
		uids = append(uids, it.GetUid())
	}
	if len(uids) > 8 {
		uids = append(uids[:3], fmt.Sprintf("... (%d items) ...", len(uids)-4), uids[len(uids)-1])
	}
	return d + " [" + strings.Join(uids, " ") + "]"
}

// pending lists the pending envelope ids in revision order.
func pending(m *Machine) string {
	envs := make([]*agentv1.Envelope, 0, len(m.pending))
	for _, env := range m.pending {
		envs = append(envs, env)
	}
	slices.SortFunc(envs, func(a, b *agentv1.Envelope) int {
		if a.GetRevision() != b.GetRevision() {
			return int(a.GetRevision()) - int(b.GetRevision())
		}
		return strings.Compare(a.GetId(), b.GetId())
	})
	var ids []string
	for _, env := range envs {
		ids = append(ids, env.GetId())
	}
	if len(ids) > 8 {
		ids = append(ids[:3], fmt.Sprintf("... (%d) ...", len(ids)-4), ids[len(ids)-1])
	}
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, " ")
}

func show(m *Machine) []string {
	var q []string
	for _, env := range m.queue {
		q = append(q, describe(env))
	}
	if len(q) > 6 {
		q = append(q[:2], fmt.Sprintf("... (%d) ...", len(q)-3), q[len(q)-1])
	}
	out := []string{
		fmt.Sprintf("rev %d, agent rev %d", m.rev, m.agent.Last()),
		fmt.Sprintf("queue (%d): %s", len(m.queue), strings.Join(q, ", ")),
		"pending: " + pending(m),
	}
	if m.snap != nil {
		out = append(out, "snapshot slot: "+describe(m.snap))
	}
	if len(m.batches) > 0 {
		var bs []string
		for id, joined := range m.batches {
			bs = append(bs, id+"+"+strings.Join(joined, "+"))
		}
		slices.Sort(bs)
		out = append(out, "batches: "+strings.Join(bs, " "))
	}
	if m.resync {
		out = append(out, fmt.Sprintf("resync owed: changes after rev %d", m.resyncMark))
	}
	if m.builds > 0 || len(m.recent) > 0 {
		var r []string
		for _, env := range m.recent {
			r = append(r, fmt.Sprint(strings.TrimPrefix(env.GetKind().String(), "KIND_"), "@", env.GetRevision()))
		}
		out = append(out, fmt.Sprintf("building %d, recent: %s", m.builds, strings.Join(r, " ")))
	}
	if m.reason != "" {
		out = append(out, "closed: "+m.reason)
	}
	return out
}
