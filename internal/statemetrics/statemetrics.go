package statemetrics

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
)

// Names of the series, for docs and tests.
const (
	FleetNodes       = "drover_fleet_nodes"
	NodeJobs         = "drover_node_jobs"
	NodeJobNodes     = "drover_node_job_nodes"
	FleetJobs        = "drover_fleet_jobs"
	Tasks            = "drover_tasks"
	JobFailed        = "drover_job_failed"
	HubLeaseExpired  = "drover_hub_lease_expired"
	hubLeasePrefix   = "drover-hub-"
	unsetPhaseLabel  = "Unset"
	listTimeout      = 10 * time.Second
	kindFleetJob     = "FleetJob"
	kindNodeUpgrade  = "NodeUpgradeJob"
	kindImagePrePull = "ImagePrePullJob"
)

// Options configure a Collector.
type Options struct {
	// Reader lists objects; the manager's cache. Required.
	Reader client.Reader
	// Namespace holds the hubs' Leases (drover-hub-<name>). Required.
	Namespace string
	// Elected is closed once this manager leads (manager.Elected()); until
	// then the collector exports nothing. Nil: always export.
	Elected <-chan struct{}
	// NodeJobs exports the node job series (the NodeUpgradeJob and
	// ImagePrePullJob controllers run).
	NodeJobs bool
	// Tasks exports the FleetJob and Task series.
	Tasks bool
	// Clock tells Lease expiry. Default: the real clock.
	Clock clock.Clock
	// Logger reports list errors. Default: discard.
	Logger *slog.Logger
}

// Collector is a prometheus.Collector over the cache.
type Collector struct {
	opts Options
	// Descriptions are read-only after New.
	fleetNodes, nodeJobs, nodeJobNodes, fleetJobs, tasks, jobFailed, leaseExpired *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector; register it on the manager's registry.
func New(opts Options) *Collector {
	opts.Clock = clock.Or(opts.Clock)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Collector{opts: opts,
		fleetNodes: prometheus.NewDesc(FleetNodes, "FleetNodes by the hub in their status (empty before a hub took them) and phase.", []string{"hub", "phase"}, nil),
		nodeJobs:   prometheus.NewDesc(NodeJobs, "Node jobs (NodeUpgradeJob, ImagePrePullJob) by kind and phase.", []string{"kind", "phase"}, nil),
		nodeJobNodes: prometheus.NewDesc(NodeJobNodes, "Nodes of the node jobs that have not ended (phase Init or InProgress), by kind and node task phase, from the jobs' status counts.",
			[]string{"kind", "phase"}, nil),
		fleetJobs:    prometheus.NewDesc(FleetJobs, "FleetJobs by phase.", []string{"phase"}, nil),
		tasks:        prometheus.NewDesc(Tasks, "Tasks by the state of their current attempt.", []string{"state"}, nil),
		jobFailed:    prometheus.NewDesc(JobFailed, "1 for each FleetJob and node job that failed and still exists (one series per failed job).", []string{"kind", "namespace", "name", "reason"}, nil),
		leaseExpired: prometheus.NewDesc(HubLeaseExpired, "1 when a hub's Lease was not renewed within its duration (the hub is down or cut off from the API), else 0.", []string{"hub"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.fleetNodes, c.nodeJobs, c.nodeJobNodes, c.fleetJobs, c.tasks, c.jobFailed, c.leaseExpired} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.opts.Elected != nil {
		select {
		case <-c.opts.Elected:
		default:
			return
		}
	}
	// A scrape has no context of its own; the cache answers from memory,
	// the bound only guards against a cache that never synced.
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	c.collectNodes(ctx, ch)
	c.collectLeases(ctx, ch)
	if c.opts.NodeJobs {
		c.collectNodeJobs(ctx, ch)
	}
	if c.opts.Tasks {
		c.collectTasks(ctx, ch)
	}
}

func (c *Collector) list(ctx context.Context, l client.ObjectList, what string, opts ...client.ListOption) bool {
	opts = append(opts, client.UnsafeDisableDeepCopy)
	if err := c.opts.Reader.List(ctx, l, opts...); err != nil {
		c.opts.Logger.Warn("list for metrics; these series are left out of this scrape", "kind", what, "err", err)
		return false
	}
	return true
}

func phase(p string) string {
	if p == "" {
		return unsetPhaseLabel
	}
	return p
}

type key2 struct{ a, b string }

func (c *Collector) collectNodes(ctx context.Context, ch chan<- prometheus.Metric) {
	var l fleetv1.FleetNodeList
	if !c.list(ctx, &l, "FleetNode") {
		return
	}
	n := map[key2]float64{}
	for _, p := range []fleetv1.FleetNodePhase{fleetv1.FleetNodePending, fleetv1.FleetNodeOnline, fleetv1.FleetNodeOffline, fleetv1.FleetNodeRevoked} {
		n[key2{"", string(p)}] = 0
	}
	for i := range l.Items {
		n[key2{l.Items[i].Status.Hub, phase(string(l.Items[i].Status.Phase))}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(c.fleetNodes, prometheus.GaugeValue, v, k.a, k.b)
	}
}

func (c *Collector) collectLeases(ctx context.Context, ch chan<- prometheus.Metric) {
	var l coordinationv1.LeaseList
	if !c.list(ctx, &l, "Lease", client.InNamespace(c.opts.Namespace)) {
		return
	}
	now := c.opts.Clock.Now()
	for i := range l.Items {
		ls := &l.Items[i]
		hub, ok := strings.CutPrefix(ls.Name, hubLeasePrefix)
		if !ok || hub == "" {
			continue
		}
		expired := 1.0
		if ls.Spec.RenewTime != nil && ls.Spec.LeaseDurationSeconds != nil &&
			now.Before(ls.Spec.RenewTime.Add(time.Duration(*ls.Spec.LeaseDurationSeconds)*time.Second)) {
			expired = 0
		}
		ch <- prometheus.MustNewConstMetric(c.leaseExpired, prometheus.GaugeValue, expired, hub)
	}
}

var (
	jobPhases  = []opsv1.JobPhase{opsv1.JobPhaseInit, opsv1.JobPhaseInProgress, opsv1.JobPhaseCompleted, opsv1.JobPhaseFailure}
	taskPhases = []opsv1.NodeTaskPhase{opsv1.NodeTaskPhasePending, opsv1.NodeTaskPhaseInProgress, opsv1.NodeTaskPhaseSuccessful, opsv1.NodeTaskPhaseFailure, opsv1.NodeTaskPhaseUnknown}
)

// nodeJob is what the collector reads of either node job kind.
type nodeJob struct {
	name   string
	status *opsv1.NodeJobStatus
}

func (c *Collector) collectNodeJobs(ctx context.Context, ch chan<- prometheus.Metric) {
	jobs := map[string][]nodeJob{}
	var up opsv1.NodeUpgradeJobList
	if c.list(ctx, &up, kindNodeUpgrade) {
		for i := range up.Items {
			jobs[kindNodeUpgrade] = append(jobs[kindNodeUpgrade], nodeJob{up.Items[i].Name, &up.Items[i].Status})
		}
	} else {
		return
	}
	var pp opsv1.ImagePrePullJobList
	if c.list(ctx, &pp, kindImagePrePull) {
		for i := range pp.Items {
			jobs[kindImagePrePull] = append(jobs[kindImagePrePull], nodeJob{pp.Items[i].Name, &pp.Items[i].Status})
		}
	} else {
		return
	}
	for _, kind := range []string{kindNodeUpgrade, kindImagePrePull} {
		byPhase := map[string]float64{}
		for _, p := range jobPhases {
			byPhase[string(p)] = 0
		}
		nodes := map[opsv1.NodeTaskPhase]float64{}
		for _, p := range taskPhases {
			nodes[p] = 0
		}
		for _, j := range jobs[kind] {
			s := j.status
			byPhase[phase(string(s.Phase))]++
			if s.Phase == opsv1.JobPhaseFailure {
				ch <- prometheus.MustNewConstMetric(c.jobFailed, prometheus.GaugeValue, 1, kind, "", j.name, conditionReason(s.Conditions, opsv1.ConditionFailed))
			}
			if s.Phase == opsv1.JobPhaseCompleted || s.Phase == opsv1.JobPhaseFailure {
				continue
			}
			nodes[opsv1.NodeTaskPhasePending] += float64(s.Counts.Pending)
			nodes[opsv1.NodeTaskPhaseInProgress] += float64(s.Counts.InProgress)
			nodes[opsv1.NodeTaskPhaseSuccessful] += float64(s.Counts.Successful)
			nodes[opsv1.NodeTaskPhaseFailure] += float64(s.Counts.Failure)
			nodes[opsv1.NodeTaskPhaseUnknown] += float64(s.Counts.Unknown)
		}
		for p, v := range byPhase {
			ch <- prometheus.MustNewConstMetric(c.nodeJobs, prometheus.GaugeValue, v, kind, p)
		}
		for p, v := range nodes {
			ch <- prometheus.MustNewConstMetric(c.nodeJobNodes, prometheus.GaugeValue, v, kind, string(p))
		}
	}
}

func (c *Collector) collectTasks(ctx context.Context, ch chan<- prometheus.Metric) {
	var fj batchv1.FleetJobList
	if c.list(ctx, &fj, kindFleetJob) {
		byPhase := map[string]float64{}
		for _, p := range []batchv1.GroupPhase{batchv1.GroupPending, batchv1.GroupRunning, batchv1.GroupCompleted, batchv1.GroupFailed} {
			byPhase[string(p)] = 0
		}
		for i := range fj.Items {
			j := &fj.Items[i]
			byPhase[phase(string(j.Status.Phase))]++
			if j.Status.Phase == batchv1.GroupFailed {
				ch <- prometheus.MustNewConstMetric(c.jobFailed, prometheus.GaugeValue, 1, kindFleetJob, j.Namespace, j.Name, conditionReason(j.Status.Conditions, batchv1.ConditionFailed))
			}
		}
		for p, v := range byPhase {
			ch <- prometheus.MustNewConstMetric(c.fleetJobs, prometheus.GaugeValue, v, p)
		}
	}
	var tl batchv1.TaskList
	if c.list(ctx, &tl, "Task") {
		byState := map[string]float64{}
		for _, s := range []batchv1.TaskState{batchv1.TaskPending, batchv1.TaskScheduled, batchv1.TaskDispatching, batchv1.TaskRunning, batchv1.TaskCompleted, batchv1.TaskFailed} {
			byState[string(s)] = 0
		}
		for i := range tl.Items {
			byState[phase(string(tl.Items[i].Status.State))]++
		}
		for s, v := range byState {
			ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.GaugeValue, v, s)
		}
	}
}

// conditionReason is the reason of condition t, "" without one.
func conditionReason(cs []metav1.Condition, t string) string {
	if c := meta.FindStatusCondition(cs, t); c != nil {
		return c.Reason
	}
	return ""
}
