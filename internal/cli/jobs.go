package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// jobKind describes one node job kind for the CLI.
type jobKind struct {
	kind    string
	names   []string // accepted spellings on the command line
	newJob  func() opsv1.NodeJob
	newList func() client.ObjectList
	items   func(client.ObjectList) []opsv1.NodeJob
}

func jobKinds() []jobKind {
	return []jobKind{
		{
			kind:    "NodeUpgradeJob",
			names:   []string{"nodeupgradejobs", "nodeupgradejob", "nuj"},
			newJob:  func() opsv1.NodeJob { return &opsv1.NodeUpgradeJob{} },
			newList: func() client.ObjectList { return &opsv1.NodeUpgradeJobList{} },
			items: func(l client.ObjectList) []opsv1.NodeJob {
				var out []opsv1.NodeJob
				for i := range l.(*opsv1.NodeUpgradeJobList).Items {
					out = append(out, &l.(*opsv1.NodeUpgradeJobList).Items[i])
				}
				return out
			},
		},
		{
			kind:    "ImagePrePullJob",
			names:   []string{"imageprepulljobs", "imageprepulljob", "ippj"},
			newJob:  func() opsv1.NodeJob { return &opsv1.ImagePrePullJob{} },
			newList: func() client.ObjectList { return &opsv1.ImagePrePullJobList{} },
			items: func(l client.ObjectList) []opsv1.NodeJob {
				var out []opsv1.NodeJob
				for i := range l.(*opsv1.ImagePrePullJobList).Items {
					out = append(out, &l.(*opsv1.ImagePrePullJobList).Items[i])
				}
				return out
			},
		},
	}
}

func findJobKind(arg string) (jobKind, bool) {
	for _, k := range jobKinds() {
		for _, n := range k.names {
			if strings.EqualFold(arg, n) {
				return k, true
			}
		}
	}
	return jobKind{}, false
}

func getJob(ctx context.Context, c client.Client, k jobKind, name string) (opsv1.NodeJob, error) {
	j := k.newJob()
	if err := c.Get(ctx, client.ObjectKey{Name: name}, j); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%s %s not found", k.kind, name)
		}
		return nil, fmt.Errorf("get %s %s: %w", k.kind, name, err)
	}
	return j, nil
}

func printJobs(w io.Writer, jobs []opsv1.NodeJob, now time.Time) error {
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].GetName() < jobs[j].GetName() })
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPHASE\tTOTAL\tPENDING\tIN-PROGRESS\tSUCCESSFUL\tFAILED\tUNKNOWN\tPROGRESS\tAGE")
	for _, j := range jobs {
		st := j.JobStatus()
		c := st.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", j.GetName(), orNone(string(st.Phase)), c.Total, c.Pending, c.InProgress,
			c.Successful, c.Failure, c.Unknown, bar(c, 20), duration.HumanDuration(now.Sub(j.GetCreationTimestamp().Time)))
	}
	return tw.Flush()
}

// bar draws a job's progress: done nodes (successful, failed, unknown) of total.
func bar(c opsv1.NodeTaskCounts, width int) string {
	if c.Total == 0 {
		return "[" + strings.Repeat(" ", width) + "]   0%"
	}
	done := c.Successful + c.Failure + c.Unknown
	fill := int(done) * width / int(c.Total)
	return fmt.Sprintf("[%s%s] %3d%%", strings.Repeat("#", fill), strings.Repeat(".", width-fill), int(done)*100/int(c.Total))
}

// printSecretRef names the Secret a job's registry credentials come from.
func printSecretRef(w io.Writer, ref *corev1.SecretReference) {
	if ref != nil {
		fmt.Fprintf(w, "Credentials: Secret %s/%s\n", ref.Namespace, ref.Name)
	}
}

// describeJob prints a job and every node's detail, merged from its slices.
func describeJob(ctx context.Context, w io.Writer, c client.Client, j opsv1.NodeJob, now time.Time) error {
	st := j.JobStatus()
	fmt.Fprintf(w, "Name:        %s\nKind:        %s\nPhase:       %s\n", j.GetName(), j.JobKind(), orNone(string(st.Phase)))
	switch job := j.(type) {
	case *opsv1.NodeUpgradeJob:
		src := job.Spec.Artifact.URL + job.Spec.Artifact.Image
		fmt.Fprintf(w, "Version:     %s\nArtifact:    %s (sha256 %s)\nConfirm:     %v\n", job.Spec.Version, src, job.Spec.Artifact.SHA256, job.Spec.RequireConfirmation)
		printSecretRef(w, job.Spec.Artifact.ImageSecretRef)
	case *opsv1.ImagePrePullJob:
		fmt.Fprintf(w, "Images:      %s\n", strings.Join(job.Spec.Images, ", "))
		printSecretRef(w, job.Spec.ImageSecretRef)
	}
	ex := j.Execution()
	fmt.Fprintf(w, "Concurrency: %d   Timeout: %ds   FailureTolerate: %s   Aborted: %v\n", ex.Concurrency, ex.TimeoutSeconds, orNone(ex.FailureTolerate), j.Aborted())
	cn := st.Counts
	fmt.Fprintf(w, "Nodes:       %d total, %d pending, %d in progress, %d successful, %d failed, %d unknown  %s\n",
		cn.Total, cn.Pending, cn.InProgress, cn.Successful, cn.Failure, cn.Unknown, bar(cn, 30))
	for _, cond := range st.Conditions {
		fmt.Fprintf(w, "Condition:   %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	var slices opsv1.NodeTaskSliceList
	if err := c.List(ctx, &slices, client.MatchingLabels{opsv1.LabelJobUID: string(j.GetUID())}); err != nil {
		return fmt.Errorf("list NodeTaskSlices: %w", err)
	}
	var nodes []opsv1.NodeTaskStatus
	for _, s := range slices.Items {
		nodes = append(nodes, s.Nodes...)
	}
	sort.Slice(nodes, func(a, b int) bool { return nodes[a].NodeName < nodes[b].NodeName })
	fmt.Fprintf(w, "\nNode detail (%d nodes in %d NodeTaskSlices):\n", len(nodes), len(slices.Items))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tPHASE\tACTION\tVERSION\tUPDATED\tREASON")
	for _, n := range nodes {
		ver := n.CurrentVersion
		switch {
		case n.Action == nodejobwire.RollBack && ver != "":
			// historic/current were written by the upgrade it undid.
			ver += " (rolled back)"
		case n.HistoricVersion != "" && n.HistoricVersion != ver:
			ver = n.HistoricVersion + " → " + ver
		}
		upd := "<none>"
		if n.UpdateTime != nil {
			upd = duration.HumanDuration(now.Sub(n.UpdateTime.Time)) + " ago"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", n.NodeName, n.Phase, orNone(n.Action), orNone(ver), upd, n.Reason)
		for _, a := range n.ActionFlow {
			fmt.Fprintf(tw, "    %s\n", actionLine(a))
		}
		for _, img := range n.ImageStatus {
			fmt.Fprintf(tw, "    image %s\t%s\t\t\t\t%s\n", img.Image, img.Status, img.Reason)
		}
	}
	return tw.Flush()
}

// actionLine is one record of a node's action flow: Confirm, for one,
// shows when the node began to wait, when it was confirmed and by whom.
func actionLine(a opsv1.ActionStatus) string {
	state := map[string]string{"True": "succeeded", "False": "failed", "Unknown": "running"}[string(a.Status)]
	if a.Status == "Unknown" && nodejobwire.Waits(a.Action) {
		state = "waiting"
	}
	line := fmt.Sprintf("%-9s %-9s", a.Action, state)
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	switch {
	case a.StartTime != nil:
		line += fmt.Sprintf(" %s → %s", stamp(a.StartTime.Time), stamp(a.Time.Time))
	case a.Status == "Unknown":
		line += " since " + stamp(a.Time.Time)
	default:
		line += " at " + stamp(a.Time.Time)
	}
	if a.By != "" {
		line += " by " + a.By
	}
	if a.Reason != "" {
		line += ": " + a.Reason
	}
	return line
}

func newDescribeCommand(g *globalOptions) *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:   "describe nodeupgradejob|imageprepulljob|fleetjob|taskgroup|task|plan|app|session NAME",
		Short: "Show a node job with every node's detail, a fleet job or task group with its tasks, a task with its attempts and output, or an in-place update plan as a tree (sequence, pool, node, updater task)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if isPlanKind(args[0]) {
				c, err := g.client()
				if err != nil {
					return err
				}
				return describePlan(cmd.Context(), cmd.OutOrStdout(), c, args[1], time.Now())
			}
			switch appKinds[strings.ToLower(args[0])] {
			case "Application", "ApplicationSession":
				c, err := g.client()
				if err != nil {
					return err
				}
				if appKinds[strings.ToLower(args[0])] == "Application" {
					return describeApp(cmd.Context(), cmd.OutOrStdout(), c, g.namespace(namespace), args[1], time.Now())
				}
				return describeSession(cmd.Context(), cmd.OutOrStdout(), c, g.namespace(namespace), args[1], time.Now())
			}
			switch kind := batchKinds[strings.ToLower(args[0])]; kind {
			case "Task":
				return describeTaskCommand(cmd, g, g.namespace(namespace), args[1])
			case "FleetJob", "TaskGroup":
				c, err := g.client()
				if err != nil {
					return err
				}
				return describeGroupOrJob(cmd.Context(), cmd.OutOrStdout(), c, kind, g.namespace(namespace), args[1], time.Now())
			}
			k, ok := findJobKind(args[0])
			if !ok {
				return fmt.Errorf("unknown kind %q: want nodeupgradejob, imageprepulljob, fleetjob, taskgroup, task, plan, app or session", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := getJob(cmd.Context(), c, k, args[1])
			if err != nil {
				return err
			}
			return describeJob(cmd.Context(), cmd.OutOrStdout(), c, j, time.Now())
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of a fleet job, task group, task, app or session"+namespaceFlagHelp)
	return cmd
}

func newWatchCommand(g *globalOptions) *cobra.Command {
	var interval, timeout time.Duration
	cmd := &cobra.Command{
		Use:   "watch nodeupgradejob|imageprepulljob|plan NAME",
		Short: "Follow a node job until it is Completed or Failure, or an in-place update plan until it ends",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, ok := findJobKind(args[0])
			plan := isPlanKind(args[0])
			if !ok && !plan {
				return fmt.Errorf("unknown kind %q: want nodeupgradejob, imageprepulljob or plan", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			out := cmd.OutOrStdout()
			if plan {
				var live *liveBar
				if isTerminal(out) {
					live = newLiveBar(ctx, out, args[1], 0)
					defer live.stop()
				}
				return watchPlan(ctx, out, c, args[1], interval, live)
			}
			last := ""
			var live *liveBar
			if isTerminal(out) {
				live = newLiveBar(ctx, out, args[1], 0)
				defer live.stop()
			}
			for {
				j, err := getJob(ctx, c, k, args[1])
				if err != nil {
					return err
				}
				st := j.JobStatus()
				if live != nil {
					live.set(st)
					if st.Phase.Final() {
						live.stop()
					}
				} else {
					line := fmt.Sprintf("%s %s %s  %d/%d done (%d ok, %d failed, %d unknown, %d running)", time.Now().Format("15:04:05"),
						orNone(string(st.Phase)), bar(st.Counts, 30), st.Counts.Successful+st.Counts.Failure+st.Counts.Unknown, st.Counts.Total,
						st.Counts.Successful, st.Counts.Failure, st.Counts.Unknown, st.Counts.InProgress)
					if key := line[9:]; key != last {
						fmt.Fprintln(out, line)
						last = key
					}
				}
				if st.Phase.Final() {
					for _, f := range st.Failures {
						fmt.Fprintf(out, "  %s %s at %s: %s\n", f.NodeName, f.Phase, orNone(f.Action), f.Reason)
					}
					if st.Phase == opsv1.JobPhaseFailure {
						return fmt.Errorf("%s %s failed", k.kind, j.GetName())
					}
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("stopped watching %s %s in phase %s: %w", k.kind, j.GetName(), st.Phase, ctx.Err())
				case <-time.After(interval):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often to poll")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (0 = never)")
	return cmd
}

func newConfirmCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "confirm JOB [NODE...]",
		Short: "Let a NodeUpgradeJob's nodes past Confirm (all nodes, or those named); nodes record who confirmed",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			job := &opsv1.NodeUpgradeJob{}
			by := whoAmI(cmd.Context(), c)
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := c.Get(cmd.Context(), client.ObjectKey{Name: args[0]}, job); err != nil {
					return err
				}
				if !job.Spec.RequireConfirmation {
					return fmt.Errorf("NodeUpgradeJob %s does not require confirmation", args[0])
				}
				if job.Spec.Confirmed == nil {
					job.Spec.Confirmed = &opsv1.Confirmation{}
				}
				if by != "" {
					job.Spec.Confirmed.By = by
				}
				if len(args) == 1 {
					job.Spec.Confirmed.All = true
				} else {
					have := map[string]bool{}
					for _, n := range job.Spec.Confirmed.NodeNames {
						have[n] = true
					}
					for _, n := range args[1:] {
						if !have[n] {
							job.Spec.Confirmed.NodeNames = append(job.Spec.Confirmed.NodeNames, n)
							have[n] = true
						}
					}
				}
				return c.Update(cmd.Context(), job)
			})
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("NodeUpgradeJob %s not found", args[0])
			}
			if err != nil {
				return err
			}
			who := "all nodes"
			if len(args) > 1 {
				who = strings.Join(args[1:], ", ")
			}
			cmd.Printf("nodeupgradejob/%s confirmed for %s\n", args[0], who)
			return nil
		},
	}
}

// whoAmI is the caller's user name as the apiserver sees it, or "" when
// it will not say (SelfSubjectReview forbidden or absent).
func whoAmI(ctx context.Context, c client.Client) string {
	r := &authnv1.SelfSubjectReview{}
	if err := c.Create(ctx, r); err != nil {
		return ""
	}
	return r.Status.UserInfo.Username
}

func newAbortCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "abort nodeupgradejob|imageprepulljob|plan NAME",
		Short: "Stop a node job (no new nodes start; running ones finish or roll back; the job ends Failure) or an in-place update plan (every node ends updated or aborted)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if isPlanKind(args[0]) {
				c, err := g.client()
				if err != nil {
					return err
				}
				if err := abortPlan(cmd.Context(), c, args[1]); err != nil {
					return err
				}
				cmd.Printf("inplaceupdateplan/%s aborting\n", args[1])
				return nil
			}
			k, ok := findJobKind(args[0])
			if !ok {
				return fmt.Errorf("unknown kind %q: want nodeupgradejob or imageprepulljob", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var j opsv1.NodeJob
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				var err error
				if j, err = getJob(cmd.Context(), c, k, args[1]); err != nil {
					return err
				}
				if j.JobStatus().Phase.Final() {
					return fmt.Errorf("%s %s has already ended (%s)", k.kind, args[1], j.JobStatus().Phase)
				}
				switch job := j.(type) {
				case *opsv1.NodeUpgradeJob:
					job.Spec.Abort = true
				case *opsv1.ImagePrePullJob:
					job.Spec.Abort = true
				}
				return c.Update(cmd.Context(), j)
			})
			if err != nil {
				return err
			}
			cmd.Printf("%s/%s aborted\n", strings.ToLower(k.kind), args[1])
			return nil
		},
	}
}

// getJobs lists jobs of kind k (all of them, or those named).
func getJobs(ctx context.Context, c client.Client, k jobKind, names []string) ([]opsv1.NodeJob, error) {
	if len(names) == 0 {
		l := k.newList()
		if err := c.List(ctx, l); err != nil {
			return nil, fmt.Errorf("list %ss: %w", k.kind, err)
		}
		return k.items(l), nil
	}
	var out []opsv1.NodeJob
	var errs []error
	for _, n := range names {
		j, err := getJob(ctx, c, k, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, j)
	}
	return out, errors.Join(errs...)
}
