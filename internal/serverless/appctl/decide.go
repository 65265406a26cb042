package appctl

import (
	"sort"
	"time"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
)

// The decision of one Application's reconcile is pure: given the spec,
// the instances as the slices and the hub's reports show them, the
// sessions waiting for an instance and the time, decide which instances go,
// which are added, and where each waiting session is bound. The controller
// only reads caches, calls decide, places the new instances and writes.

// Removal reasons (and Event reasons).
const (
	// RemoveTerminated: the hub reported the instance Terminated (crash,
	// failed start, timeout); it is replaced if still needed.
	RemoveTerminated = "InstanceTerminated"
	// RemoveNodeLost: the instance's node is Offline, Revoked or deleted.
	RemoveNodeLost = "NodeLost"
	// RemoveIdle: without a session for idleInstanceTimeout.
	RemoveIdle = "IdleTimeout"
	// RemoveExcess: more instances than the spec asks for (the spec
	// changed, or the mode).
	RemoveExcess = "ScaledDown"
)

// Instance is what decide knows of one instance.
type Instance struct {
	Name    string
	Node    string
	Standby bool
	Created time.Time
	// State as last reported; InstancePending when not reported yet.
	State serverlessv1.InstanceState
	// Since is when it entered State (zero: Created).
	Since time.Time
	// Sessions bound to it and not ended (from the sessions' specs and the
	// bindings this manager made that its cache does not show yet).
	Sessions int
	// NodeLost: its node is gone (Offline, Revoked, deleted).
	NodeLost bool
	// NodeReady: its node is Online and connected, so a session bound to
	// it can start.
	NodeReady bool
}

// notLive: the instance has not passed liveness yet (counted by burst).
func (i *Instance) notLive() bool {
	switch i.State {
	case "", serverlessv1.InstancePending, serverlessv1.InstanceCreating, serverlessv1.InstanceLivenessChecking:
		return true
	}
	return false
}

// leaving: the instance is on its way out; it serves no new session.
func (i *Instance) leaving() bool {
	switch i.State {
	case serverlessv1.InstanceEvacuating, serverlessv1.InstanceTerminating, serverlessv1.InstanceTerminated:
		return true
	}
	return false
}

// Pending is a session waiting for an instance.
type Pending struct {
	Key     string // namespace/name
	Created time.Time
}

// Input is everything decide reads.
type Input struct {
	Now     time.Time
	Mode    string
	Scaling serverlessv1.Scaling
	// Instances of the Application, every slice.
	Instances []Instance
	// Pending sessions, bound in this order.
	Pending []Pending
}

// Removal is an instance to take out of its slice.
type Removal struct {
	Name   string
	Reason string
}

// Add is an instance to create; ForSession, when set, is the session bound
// to it at once (the cold path), and Standby is then false.
type Add struct {
	Standby    bool
	ForSession string
}

// Binding binds a session to an existing instance (Instance) or to the
// Add at index NewIndex (Instance == "").
type Binding struct {
	Session  string
	Instance string
	NewIndex int
}

// Decision is what decide returns.
type Decision struct {
	Remove []Removal
	Add    []Add
	Bind   []Binding
	// NoCapacity are the pending sessions that fit nowhere: every
	// instance is full and the Application is at maxInstances.
	NoCapacity []string
	// Requeue is when to look again (the next idle timeout); 0: on the
	// next change.
	Requeue time.Duration
	// Want is how many instances the spec asks to hold at least.
	Want int
	// Missing is how many instances the spec asks for beyond those held
	// (before burst): 0 means the pool and minInstances are full.
	Missing int
}

// Defaults of Scaling, for objects stored without them.
func scalingDefaults(s serverlessv1.Scaling) serverlessv1.Scaling {
	if s.MaxInstances <= 0 {
		s.MaxInstances = 10
	}
	if s.Burst <= 0 {
		s.Burst = 2
	}
	if s.SessionsPerInstance <= 0 {
		s.SessionsPerInstance = 1
	}
	if s.IdleInstanceTimeout.Duration <= 0 {
		s.IdleInstanceTimeout.Duration = 5 * time.Minute
	}
	return s
}

// bindPreference orders the instances a session may take: an Idle or
// serving instance is thawed already, a Standby one must be thawed, and a
// standby not live yet will be soon.
func bindPreference(s serverlessv1.InstanceState) int {
	switch s {
	case serverlessv1.InstanceIdle:
		return 0
	case serverlessv1.InstanceRunning, serverlessv1.InstanceActivating:
		return 1
	case serverlessv1.InstanceStandby:
		return 2
	}
	return -1
}

func decide(in Input) Decision {
	sc := scalingDefaults(in.Scaling)
	var d Decision
	live := make([]*Instance, 0, len(in.Instances))
	for i := range in.Instances {
		inst := &in.Instances[i]
		switch {
		case inst.NodeLost:
			d.Remove = append(d.Remove, Removal{inst.Name, RemoveNodeLost})
		case inst.State == serverlessv1.InstanceTerminated:
			d.Remove = append(d.Remove, Removal{inst.Name, RemoveTerminated})
		default:
			live = append(live, inst)
		}
	}
	// Stable order: oldest first, so scale-down takes the newest.
	sort.SliceStable(live, func(i, j int) bool {
		if !live[i].Created.Equal(live[j].Created) {
			return live[i].Created.Before(live[j].Created)
		}
		return live[i].Name < live[j].Name
	})
	maxN := int(sc.MaxInstances)
	minN := int(sc.MinInstances)
	spi := int(sc.SessionsPerInstance)

	if in.Mode == serverlessv1.ModeDaemon {
		d.Want = min(minN, maxN)
		n := len(live)
		if n > d.Want {
			// Newest first, not-live ones before live ones.
			for _, inst := range newestFirst(live) {
				if n <= d.Want {
					break
				}
				d.Remove = append(d.Remove, Removal{inst.Name, RemoveExcess})
				n--
			}
			return d
		}
		d.Missing = d.Want - n
		room := min(d.Want-n, int(sc.Burst)-countNotLive(live))
		for range max(room, 0) {
			d.Add = append(d.Add, Add{})
		}
		return d
	}

	// Sessions: bind the pending ones first, so that an instance a session
	// takes is not scaled down under it.
	total := len(live)
	for _, p := range in.Pending {
		var best *Instance
		for _, inst := range live {
			pref := bindPreference(inst.State)
			if pref < 0 || !inst.NodeReady || inst.Sessions >= spi {
				continue
			}
			if best == nil || pref < bindPreference(best.State) {
				best = inst
			}
		}
		if best != nil {
			best.Sessions++
			d.Bind = append(d.Bind, Binding{Session: p.Key, Instance: best.Name})
			continue
		}
		// A new active instance taken by this session; with more
		// sessions per instance, the next pending ones share it.
		shared := false
		for k := range d.Bind {
			b := d.Bind[k]
			if b.Instance != "" {
				continue
			}
			taken := 0
			for _, b2 := range d.Bind {
				if b2.Instance == "" && b2.NewIndex == b.NewIndex {
					taken++
				}
			}
			if taken < spi {
				d.Bind = append(d.Bind, Binding{Session: p.Key, NewIndex: b.NewIndex})
				shared = true
				break
			}
		}
		if shared {
			continue
		}
		if total >= maxN {
			d.NoCapacity = append(d.NoCapacity, p.Key)
			continue
		}
		total++
		d.Add = append(d.Add, Add{ForSession: p.Key})
		d.Bind = append(d.Bind, Binding{Session: p.Key, NewIndex: len(d.Add) - 1})
	}

	// Idle instances past their timeout go, keeping minInstances; so do
	// standby instances beyond the pool (the spec lowered it).
	d.Want = max(min(minN, maxN), 0)
	keep := total
	var wake time.Time
	var freeStandby int
	for _, inst := range live {
		if inst.Standby && inst.Sessions == 0 && !inst.leaving() && (inst.notLive() || inst.State == serverlessv1.InstanceStandby) {
			freeStandby++
		}
	}
	for _, inst := range newestFirst(live) {
		if inst.Sessions > 0 || inst.leaving() {
			continue
		}
		switch {
		case inst.State == serverlessv1.InstanceIdle && keep > maxN:
			d.Remove = append(d.Remove, Removal{inst.Name, RemoveExcess})
			keep--
		case inst.State == serverlessv1.InstanceIdle:
			since := inst.Since
			if since.IsZero() {
				since = inst.Created
			}
			end := since.Add(sc.IdleInstanceTimeout.Duration)
			if keep <= minN {
				continue
			}
			if in.Now.Before(end) {
				if wake.IsZero() || end.Before(wake) {
					wake = end
				}
				continue
			}
			d.Remove = append(d.Remove, Removal{inst.Name, RemoveIdle})
			keep--
		case inst.Standby && (inst.notLive() || inst.State == serverlessv1.InstanceStandby) &&
			(freeStandby > int(sc.Standby()) || keep > maxN) && keep > minN:
			d.Remove = append(d.Remove, Removal{inst.Name, RemoveExcess})
			freeStandby--
			keep--
		}
	}
	if !wake.IsZero() {
		d.Requeue = wake.Sub(in.Now)
	}

	// Refill the standby pool and minInstances, within max and burst.
	need := min(max(int(sc.Standby())-freeStandby, minN-keep), maxN-keep)
	d.Missing = max(need, 0)
	need = min(need, int(sc.Burst)-countNotLive(live)-len(d.Add))
	for range max(need, 0) {
		d.Add = append(d.Add, Add{Standby: true})
	}
	d.Want = max(d.Want, min(int(sc.Standby()), maxN))
	return d
}

func countNotLive(list []*Instance) int {
	n := 0
	for _, i := range list {
		if i.notLive() {
			n++
		}
	}
	return n
}

// newestFirst is list (oldest first) reversed, with the instances not live
// yet before the live ones: scaling down takes what serves least.
func newestFirst(list []*Instance) []*Instance {
	out := make([]*Instance, 0, len(list))
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].notLive() {
			out = append(out, list[i])
		}
	}
	for i := len(list) - 1; i >= 0; i-- {
		if !list[i].notLive() {
			out = append(out, list[i])
		}
	}
	return out
}
