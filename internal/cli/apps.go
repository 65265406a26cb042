package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/manager"
)

// Serverless applications (serverless.drover.io) in `drover get`,
// `drover describe` and `drover session`.

// appKinds maps the command line's spellings to the kinds; "Instance" is
// not a kind but the lines of the InstanceSlices.
var appKinds = map[string]string{
	"apps": "Application", "app": "Application", "applications": "Application", "application": "Application",
	"sessions": "ApplicationSession", "session": "ApplicationSession", "sess": "ApplicationSession",
	"applicationsessions": "ApplicationSession", "applicationsession": "ApplicationSession",
	"instances": "Instance", "instance": "Instance", "inst": "Instance",
	"instanceslices": "InstanceSlice", "instanceslice": "InstanceSlice", "islice": "InstanceSlice",
}

// instanceLine is one instance: the manager's wish (a slice's spec) and
// what its agent last reported (the slice's status).
type instanceLine struct {
	namespace, app, node, name, address string
	standby                             bool
	created                             metav1.Time
	status                              *serverlessv1.InstanceStatus
}

func instanceLines(slices []serverlessv1.InstanceSlice) []instanceLine {
	var out []instanceLine
	for i := range slices {
		s := &slices[i]
		reported := map[string]*serverlessv1.InstanceStatus{}
		for j := range s.Status.Instances {
			reported[s.Status.Instances[j].Name] = &s.Status.Instances[j]
		}
		for _, in := range s.Spec.Instances {
			out = append(out, instanceLine{namespace: s.Namespace, app: s.Spec.Application, node: s.Spec.NodeName, name: in.Name,
				address: s.Status.Address, standby: in.Standby, created: in.Created, status: reported[in.Name]})
			delete(reported, in.Name)
		}
		// Reported but no longer wanted: being stopped.
		for _, st := range reported {
			out = append(out, instanceLine{namespace: s.Namespace, app: s.Spec.Application, node: s.Spec.NodeName, name: st.Name,
				address: s.Status.Address, status: st})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.namespace != b.namespace {
			return a.namespace < b.namespace
		}
		if a.app != b.app {
			return a.app < b.app
		}
		return a.name < b.name
	})
	return out
}

func (l instanceLine) state() string {
	if l.status == nil {
		return string(serverlessv1.InstancePending)
	}
	return string(l.status.State)
}

// getApps lists or gets Applications, ApplicationSessions, instances or
// InstanceSlices. For instances, names are Application names.
func getApps(ctx context.Context, out, errOut io.Writer, c client.Client, kind string, scope namespaceScope, sel labels.Selector, names []string, wide bool, now time.Time) error {
	where := "in namespace " + scope.namespace
	if scope.all {
		where = "in any namespace"
	}
	if len(names) > 0 && scope.all {
		return errors.New("a name cannot be given with --all-namespaces")
	}
	switch kind {
	case "Instance", "InstanceSlice":
		var l serverlessv1.InstanceSliceList
		if err := c.List(ctx, &l, scope.listOptions(sel)...); err != nil {
			return fmt.Errorf("list instance slices: %w", err)
		}
		items := l.Items
		if len(names) > 0 {
			want := map[string]bool{}
			for _, n := range names {
				want[n] = true
			}
			items = items[:0]
			for _, s := range l.Items {
				if want[s.Spec.Application] || (kind == "InstanceSlice" && want[s.Name]) {
					items = append(items, s)
				}
			}
		}
		if kind == "InstanceSlice" {
			if len(items) == 0 {
				fmt.Fprintf(errOut, "No instance slices found %s.\n", where)
				return nil
			}
			printSlices(out, items, scope.all, now)
			return nil
		}
		lines := instanceLines(items)
		if len(lines) == 0 {
			fmt.Fprintf(errOut, "No instances found %s.\n", where)
			return nil
		}
		printInstances(out, lines, scope.all, wide, now)
		return nil
	case "Application":
		var apps []serverlessv1.Application
		var errs []error
		if len(names) > 0 {
			for _, n := range names {
				var a serverlessv1.Application
				if err := c.Get(ctx, client.ObjectKey{Namespace: scope.namespace, Name: n}, &a); err != nil {
					errs = append(errs, notFound("application", n, scope.namespace, err))
					continue
				}
				apps = append(apps, a)
			}
		} else {
			var l serverlessv1.ApplicationList
			if err := c.List(ctx, &l, scope.listOptions(sel)...); err != nil {
				return fmt.Errorf("list applications: %w", err)
			}
			apps = l.Items
			if len(apps) == 0 {
				fmt.Fprintf(errOut, "No applications found %s.\n", where)
				return nil
			}
		}
		if len(apps) > 0 {
			printApps(out, apps, scope.all, now)
		}
		return errors.Join(errs...)
	default:
		var ss []serverlessv1.ApplicationSession
		var errs []error
		if len(names) > 0 {
			for _, n := range names {
				var s serverlessv1.ApplicationSession
				if err := c.Get(ctx, client.ObjectKey{Namespace: scope.namespace, Name: n}, &s); err != nil {
					errs = append(errs, notFound("session", n, scope.namespace, err))
					continue
				}
				ss = append(ss, s)
			}
		} else {
			var l serverlessv1.ApplicationSessionList
			if err := c.List(ctx, &l, scope.listOptions(sel)...); err != nil {
				return fmt.Errorf("list sessions: %w", err)
			}
			ss = l.Items
			if len(ss) == 0 {
				fmt.Fprintf(errOut, "No sessions found %s.\n", where)
				return nil
			}
		}
		if len(ss) > 0 {
			printSessions(out, ss, scope.all, wide, now)
		}
		return errors.Join(errs...)
	}
}

func notFound(what, name, ns string, err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s %s not found in namespace %s", what, name, ns)
	}
	return fmt.Errorf("get %s %s/%s: %w", what, ns, name, err)
}

func nsCol(withNS bool, ns string) string {
	if withNS {
		return ns + "\t"
	}
	return ""
}

func nsHead(withNS bool) string {
	if withNS {
		return "NAMESPACE\t"
	}
	return ""
}

func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func printApps(w io.Writer, apps []serverlessv1.Application, withNS bool, now time.Time) {
	sort.Slice(apps, func(i, j int) bool {
		if apps[i].Namespace != apps[j].Namespace {
			return apps[i].Namespace < apps[j].Namespace
		}
		return apps[i].Name < apps[j].Name
	})
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, nsHead(withNS)+"NAME\tMODE\tINSTANCES\tSTANDBY\tIDLE\tSERVING\tSESSIONS\tREADY\tAGE")
	for _, a := range apps {
		in, ss := a.Status.Instances, a.Status.Sessions
		ready := "<unknown>"
		if c := meta.FindStatusCondition(a.Status.Conditions, serverlessv1.ConditionReady); c != nil {
			ready = string(c.Status)
			if c.Status != metav1.ConditionTrue && c.Reason != "" {
				ready += " (" + c.Reason + ")"
			}
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", nsCol(withNS, a.Namespace), a.Name, orNone(a.Spec.Mode),
			in.Total, in.Standby, in.Idle, in.Serving, ss.Open, ready, age(a.CreationTimestamp, now))
	}
}

func printSessions(w io.Writer, ss []serverlessv1.ApplicationSession, withNS, wide bool, now time.Time) {
	sort.Slice(ss, func(i, j int) bool {
		if ss[i].Namespace != ss[j].Namespace {
			return ss[i].Namespace < ss[j].Namespace
		}
		return ss[i].Name < ss[j].Name
	})
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	defer tw.Flush()
	head := nsHead(withNS) + "NAME\tAPPLICATION\tPHASE\tNODE\tENDPOINT\tREASON\tAGE"
	if wide {
		head += "\tINSTANCE\tCLIENTS\tFLAGGED"
	}
	fmt.Fprintln(tw, head)
	for _, s := range ss {
		phase := string(s.Status.Phase)
		if phase == "" {
			phase = string(serverlessv1.SessionPending)
		}
		if s.DeletionTimestamp != nil && !s.Status.Phase.Final() {
			phase += " (closing)"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s", nsCol(withNS, s.Namespace), s.Name, s.Spec.Application, phase,
			orNone(s.Spec.NodeName), endpoint(s.Status.Endpoint), orNone(s.Status.Reason), age(s.CreationTimestamp, now))
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%t", orNone(s.Spec.InstanceName), orNone(strings.Join(s.Status.Clients, ",")), s.Status.Flagged)
		}
		fmt.Fprintln(tw)
	}
}

func endpoint(e *serverlessv1.Endpoint) string {
	if e == nil || e.Port == 0 {
		return "<none>"
	}
	host := e.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(int(e.Port))
}

func printInstances(w io.Writer, lines []instanceLine, withNS, wide bool, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	defer tw.Flush()
	head := nsHead(withNS) + "NAME\tAPPLICATION\tSTATE\tNODE\tPORT\tSESSIONS\tAGE"
	if wide {
		head += "\tSTANDBY\tSINCE\tREASON"
	}
	fmt.Fprintln(tw, head)
	for _, l := range lines {
		port, sessions, since, reason := "<none>", "0", "<none>", "<none>"
		if l.status != nil {
			if l.status.Port != 0 {
				port = strconv.Itoa(int(l.status.Port))
			}
			sessions = strconv.Itoa(len(l.status.Sessions))
			if l.status.Since != nil {
				since = duration.HumanDuration(now.Sub(l.status.Since.Time))
			}
			reason = orNone(l.status.Reason)
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s", nsCol(withNS, l.namespace), l.name, l.app, l.state(), l.node, port, sessions, age(l.created, now))
		if wide {
			fmt.Fprintf(tw, "\t%t\t%s\t%s", l.standby, since, reason)
		}
		fmt.Fprintln(tw)
	}
}

func printSlices(w io.Writer, slices []serverlessv1.InstanceSlice, withNS bool, now time.Time) {
	sort.Slice(slices, func(i, j int) bool {
		if slices[i].Namespace != slices[j].Namespace {
			return slices[i].Namespace < slices[j].Namespace
		}
		return slices[i].Name < slices[j].Name
	})
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, nsHead(withNS)+"NAME\tAPPLICATION\tNODE\tWANTED\tREPORTED\tSTANDBY\tUPDATED\tAGE")
	for _, s := range slices {
		updated := "<never>"
		if s.Status.UpdateTime != nil {
			updated = duration.HumanDuration(now.Sub(s.Status.UpdateTime.Time)) + " ago"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", nsCol(withNS, s.Namespace), s.Name, s.Spec.Application, s.Spec.NodeName,
			len(s.Spec.Instances), s.Status.Count, s.Status.Standby, updated, age(s.CreationTimestamp, now))
	}
}

// describeApp prints an Application, its instances by node and its
// sessions, and its Events.
func describeApp(ctx context.Context, w io.Writer, c client.Client, namespace, name string, now time.Time) error {
	var a serverlessv1.Application
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &a); err != nil {
		return notFound("application", name, namespace, err)
	}
	s := a.Spec
	fmt.Fprintf(w, "Name:         %s\nNamespace:    %s\nMode:         %s\nRuntime:      %s\n", a.Name, a.Namespace, s.Mode, s.Runtime)
	if s.Runtime == serverlessv1.RuntimeContainer {
		fmt.Fprintf(w, "Image:        %s\n", s.Image)
	}
	if len(s.Command) > 0 {
		fmt.Fprintf(w, "Command:      %s\n", quoteArgv(s.Command))
	}
	if len(s.Ports) > 0 {
		fmt.Fprintf(w, "Ports:        %s/%s (a host port per instance)\n", s.Ports[0].Name, orNone(s.Ports[0].Protocol))
	}
	if len(s.Resources) > 0 {
		var rs []string
		for n, q := range s.Resources {
			rs = append(rs, string(n)+"="+q.String())
		}
		sort.Strings(rs)
		fmt.Fprintf(w, "Resources:    %s\n", strings.Join(rs, ", "))
	}
	if s.NodeSelector != nil {
		if sel, err := metav1.LabelSelectorAsSelector(s.NodeSelector); err == nil {
			fmt.Fprintf(w, "Nodes:        %s\n", orNone(sel.String()))
		}
	}
	sc, sp := s.Scaling, s.Session
	fmt.Fprintf(w, "Scaling:      min %d, max %d, standby %d, burst %d, %d session(s) per instance, idle timeout %s\n",
		sc.MinInstances, sc.MaxInstances, sc.Standby(), sc.Burst, sc.SessionsPerInstance, sc.IdleInstanceTimeout.Duration)
	fmt.Fprintf(w, "Sessions:     open timeout %s, heartbeat every %s (%d missed: %s), evacuation timeout %s\n",
		sp.OpenTimeout.Duration, sp.HeartbeatInterval.Duration, sp.HeartbeatMisses, orNone(sp.OnHeartbeatLost), sp.EvacuationTimeout.Duration)
	in, ss := a.Status.Instances, a.Status.Sessions
	fmt.Fprintf(w, "Instances:    %d (creating %d, standby %d, idle %d, serving %d, terminating %d) on %d node(s)\n",
		in.Total, in.Creating, in.Standby, in.Idle, in.Serving, in.Terminating, a.Status.Nodes)
	fmt.Fprintf(w, "Sessions now: pending %d, starting %d, open %d, closing %d, terminated %d\n",
		ss.Pending, ss.Starting, ss.Open, ss.Closing, ss.Terminated)
	if len(a.Status.Conditions) > 0 {
		fmt.Fprintln(w, "Conditions:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tMESSAGE")
		for _, c := range a.Status.Conditions {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		tw.Flush()
	}
	var slices serverlessv1.InstanceSliceList
	if err := c.List(ctx, &slices, client.InNamespace(namespace), client.MatchingLabels{serverlessv1.LabelApplication: name}); err != nil {
		return fmt.Errorf("list the instances of %s/%s: %w", namespace, name, err)
	}
	if lines := instanceLines(slices.Items); len(lines) > 0 {
		fmt.Fprintln(w, "Instances:")
		printIndentedTable(w, func(tw io.Writer) { printInstances(tw, lines, false, false, now) })
	}
	var sessions serverlessv1.ApplicationSessionList
	if err := c.List(ctx, &sessions, client.InNamespace(namespace)); err == nil {
		var mine []serverlessv1.ApplicationSession
		for _, s := range sessions.Items {
			if s.Spec.Application == name && !s.Status.Phase.Final() {
				mine = append(mine, s)
			}
		}
		if len(mine) > 0 {
			fmt.Fprintln(w, "Open sessions:")
			printIndentedTable(w, func(tw io.Writer) { printSessions(tw, mine, false, false, now) })
		}
	}
	var evs corev1.EventList
	if err := c.List(ctx, &evs, client.InNamespace(namespace), client.MatchingFields{"involvedObject.uid": string(a.UID)}); err == nil {
		describeEvents(w, evs.Items, now)
	}
	return nil
}

// printIndentedTable prints a table two spaces in.
func printIndentedTable(w io.Writer, print func(io.Writer)) {
	var b strings.Builder
	print(&b)
	for _, line := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
		fmt.Fprintln(w, "  "+line)
	}
}

// describeSession prints a session and its Events.
func describeSession(ctx context.Context, w io.Writer, c client.Client, namespace, name string, now time.Time) error {
	var s serverlessv1.ApplicationSession
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
		return notFound("session", name, namespace, err)
	}
	phase := s.Status.Phase
	if phase == "" {
		phase = serverlessv1.SessionPending
	}
	fmt.Fprintf(w, "Name:         %s\nNamespace:    %s\nApplication:  %s\nPhase:        %s\n", s.Name, s.Namespace, s.Spec.Application, phase)
	if s.DeletionTimestamp != nil {
		fmt.Fprintf(w, "Closing:      since %s\n", when(s.DeletionTimestamp, now))
	}
	fmt.Fprintf(w, "Reason:       %s\n", orNone(s.Status.Reason))
	if s.Status.Message != "" {
		fmt.Fprintf(w, "Message:      %s\n", s.Status.Message)
	}
	fmt.Fprintf(w, "Instance:     %s\nNode:         %s\nEndpoint:     %s\n", orNone(s.Spec.InstanceName), orNone(s.Spec.NodeName), endpoint(s.Status.Endpoint))
	fmt.Fprintf(w, "Clients:      %s\nFlagged:      %t\n", orNone(strings.Join(s.Status.Clients, ", ")), s.Status.Flagged)
	fmt.Fprintf(w, "Created:      %s\nBound:        %s\nReady:        %s\nClosed:       %s\n",
		when(&s.CreationTimestamp, now), when(s.Status.BoundTime, now), when(s.Status.ReadyTime, now), when(s.Status.CloseTime, now))
	if s.Status.ReadyTime != nil {
		fmt.Fprintf(w, "Open took:    %s (create to Ready)\n", s.Status.ReadyTime.Sub(s.CreationTimestamp.Time))
	}
	if len(s.Spec.Data) > 0 {
		keys := make([]string, 0, len(s.Spec.Data))
		for k := range s.Spec.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintln(w, "Data:")
		for _, k := range keys {
			fmt.Fprintf(w, "  %s=%s\n", k, s.Spec.Data[k])
		}
	}
	var evs corev1.EventList
	if err := c.List(ctx, &evs, client.InNamespace(namespace), client.MatchingFields{"involvedObject.uid": string(s.UID)}); err == nil {
		describeEvents(w, evs.Items, now)
	}
	return nil
}

// parseData turns --data k=v flags into session data.
func parseData(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--data %q: want KEY=VALUE", kv)
		}
		out[k] = v
	}
	return out, nil
}

// openResult is how an open ended.
type openResult struct {
	session *serverlessv1.ApplicationSession
	took    time.Duration
}

// openSession creates a session of app and waits, watching it, until it is
// Ready (or Live) or Terminated, or ctx ends.
func openSession(ctx context.Context, c client.WithWatch, namespace, app string, data map[string]string, openTimeout time.Duration) (openResult, error) {
	var a serverlessv1.Application
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: app}, &a); err != nil {
		return openResult{}, notFound("application", app, namespace, err)
	}
	s := &serverlessv1.ApplicationSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: app + "-",
			Labels: map[string]string{serverlessv1.LabelApplication: app}},
		Spec: serverlessv1.ApplicationSessionSpec{Application: app, Data: data},
	}
	if openTimeout > 0 {
		s.Spec.OpenTimeout = &metav1.Duration{Duration: openTimeout}
	}
	start := time.Now()
	if err := c.Create(ctx, s); err != nil {
		return openResult{}, fmt.Errorf("create a session of %s/%s: %w", namespace, app, err)
	}
	w, err := c.Watch(ctx, &serverlessv1.ApplicationSessionList{}, client.InNamespace(namespace),
		client.MatchingFields{"metadata.name": s.Name})
	if err != nil {
		return openResult{session: s}, fmt.Errorf("watch session %s/%s: %w", namespace, s.Name, err)
	}
	defer w.Stop()
	// The object may have moved on before the watch began.
	if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err == nil && openEnded(s) {
		return openResult{session: s, took: time.Since(start)}, nil
	}
	for {
		select {
		case <-ctx.Done():
			return openResult{session: s, took: time.Since(start)}, fmt.Errorf("session %s/%s is still %s: %w", namespace, s.Name, orNone(string(s.Status.Phase)), context.Cause(ctx))
		case ev, ok := <-w.ResultChan():
			if !ok {
				return openResult{session: s}, fmt.Errorf("the watch of session %s/%s ended", namespace, s.Name)
			}
			switch ev.Type {
			case watch.Deleted:
				return openResult{session: s, took: time.Since(start)}, fmt.Errorf("session %s/%s was deleted before it opened", namespace, s.Name)
			case watch.Added, watch.Modified:
				got, ok := ev.Object.(*serverlessv1.ApplicationSession)
				if !ok {
					continue
				}
				s = got
				if openEnded(s) {
					return openResult{session: s, took: time.Since(start)}, nil
				}
			}
		}
	}
}

func openEnded(s *serverlessv1.ApplicationSession) bool {
	return s.Status.Phase.Open() || s.Status.Phase.Final()
}

func newSessionCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session open|close",
		Short: "Open or close a session of an application (serverless.drover.io)",
	}
	var namespace string
	var data []string
	var openTimeout, wait time.Duration
	open := &cobra.Command{
		Use:   "open APP",
		Short: "Open a session of APP and print its endpoint and how long the open took",
		Example: `  drover session open echo
  drover session open sim -n robots --data user=alice --data level=3`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseData(data)
			if err != nil {
				return err
			}
			cfg, err := g.restConfig()
			if err != nil {
				return err
			}
			c, err := client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme()})
			if err != nil {
				return fmt.Errorf("connect to the API: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			ns := g.namespace(namespace)
			r, err := openSession(ctx, c, ns, args[0], d, openTimeout)
			if err != nil {
				return err
			}
			s := r.session
			if s.Status.Phase.Final() {
				msg := s.Status.Message
				if msg != "" {
					msg = ": " + msg
				}
				return fmt.Errorf("session %s/%s of %s did not open: %s%s", ns, s.Name, args[0], orNone(s.Status.Reason), msg)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s opened in %s on node %s (instance %s)\nendpoint: %s\n",
				s.Name, r.took.Round(time.Millisecond), s.Spec.NodeName, s.Spec.InstanceName, endpoint(s.Status.Endpoint))
			return nil
		},
	}
	open.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the application"+namespaceFlagHelp)
	open.Flags().StringArrayVar(&data, "data", nil, "session data KEY=VALUE for the instance (repeatable)")
	open.Flags().DurationVar(&openTimeout, "open-timeout", 0, "the session's open timeout (default: the application's session.openTimeout)")
	open.Flags().DurationVar(&wait, "timeout", 2*time.Minute, "how long to wait for the session to open")

	var closeNS string
	var closeWait time.Duration
	closeCmd := &cobra.Command{
		Use:   "close SESSION...",
		Short: "Close sessions: their instances are told, and the objects go once they are Terminated",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ns := g.namespace(closeNS)
			var errs []error
			for _, name := range args {
				s := &serverlessv1.ApplicationSession{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
				if err := c.Delete(cmd.Context(), s); err != nil {
					errs = append(errs, notFound("session", name, ns, err))
					continue
				}
				if closeWait <= 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "session %s closing\n", name)
					continue
				}
				if err := waitGone(cmd.Context(), c, s, closeWait); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "session %s closed\n", name)
			}
			return errors.Join(errs...)
		},
	}
	closeCmd.Flags().StringVarP(&closeNS, "namespace", "n", "", "namespace of the sessions"+namespaceFlagHelp)
	closeCmd.Flags().DurationVar(&closeWait, "wait", time.Minute, "wait this long for each session to be gone (0: do not wait)")
	cmd.AddCommand(open, closeCmd)
	return cmd
}

// waitGone polls until o is deleted.
func waitGone(ctx context.Context, c client.Client, o client.Object, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		err := c.Get(ctx, client.ObjectKeyFromObject(o), o)
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s/%s is still there after %s (its node's hub removes it once the instance closed it): %w", o.GetNamespace(), o.GetName(), timeout, context.Cause(ctx))
		case <-t.C:
		}
	}
}
