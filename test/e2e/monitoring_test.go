package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// The monitoring files under config/monitoring, relative to this package.
const (
	dashboardFile   = "../../config/monitoring/grafana-dashboard.json"
	alertsFile      = "../../config/monitoring/alerts.yaml"
	ruleFile        = "../../config/monitoring/prometheus-rules.yaml"
	scrapeTimeout   = 30 * time.Second
	metricsWaitTime = 2 * time.Minute
)

// syntheticMetrics are series Prometheus makes itself; no target exports
// them.
var syntheticMetrics = map[string]bool{"up": true, "ALERTS": true, "ALERTS_FOR_STATE": true}

// TestMonitoringConfigValid checks the dashboard and the alert rules
// without a cluster: they parse, every rule has what an operator needs,
// the PrometheusRule and the plain rule file agree, and every query names
// at least one metric the extractor finds.
func TestMonitoringConfigValid(t *testing.T) {
	exprs := monitoringExprs(t)
	if len(exprs) < 20 {
		t.Fatalf("found %d queries in the dashboard and rules, want at least 20", len(exprs))
	}
	for _, e := range exprs {
		if len(metricNames(e.expr)) == 0 {
			t.Errorf("%s: query %q names no metric the extractor finds", e.where, e.expr)
		}
	}
}

// TestMonitoringMetricsExist scrapes a live `drover up` and fails naming
// every metric the dashboard or the alerts use that it does not export.
// Series that appear only after an event (an admission, a failed job) are
// made to appear by doing that event.
func TestMonitoringMetricsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: needs real drover processes and a kube-apiserver; run without -short")
	}
	want := map[string][]string{} // metric → where it is used
	for _, e := range monitoringExprs(t) {
		for _, m := range metricNames(e.expr) {
			if !syntheticMetrics[m] && !slices.Contains(want[m], e.where) {
				want[m] = append(want[m], e.where)
			}
		}
	}

	drover := testenv.Binary(t, "./cmd/drover")
	agent := testenv.Binary(t, "./cmd/drover-agent", "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v0.0.1-e2e")
	dir := filepath.Join(t.TempDir(), "data")
	up := start(t, "drover up", drover, "up", "--agents", "1", "--agent-binary", agent, "--data-dir", dir,
		"--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0")
	url := up.waitLine(t, regexp.MustCompile(`^ready metrics=(\S+)$`), startTimeout)[1]
	m := up.waitLine(t, readyRE, startTimeout)
	up.waitLine(t, regexp.MustCompile(`^1/1 agents Online$`), defaultTimeout)
	c := &cluster{drover: drover, agent: agent, kubeconfig: m[1], ca: m[3]}
	c.connect(t)

	// A FleetJob whose task fails: admission decisions, task failures and
	// drover_job_failed exist from then on.
	ctx := context.Background()
	job := &batchv1.FleetJob{
		ObjectMeta: metav1.ObjectMeta{Name: "fails", Namespace: "default"},
		Spec: batchv1.FleetJobSpec{
			NodeSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"drover.io/local": "true"}},
			RestartPolicy: batchv1.RestartNever,
			TaskGroups: []batchv1.TaskGroupTemplate{{Name: "false", Count: 1,
				Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"false"}}}}},
		},
	}
	if err := c.client.Create(ctx, job); err != nil {
		t.Fatalf("create FleetJob default/fails: %v", err)
	}
	testkit.Eventually(t, defaultTimeout, func() string {
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return err.Error()
		}
		if job.Status.Phase != batchv1.GroupFailed {
			return fmt.Sprintf("FleetJob default/fails status %+v, want phase Failed", job.Status)
		}
		return ""
	})

	var missing []string
	why := testkit.Wait(ctx, metricsWaitTime, func() string {
		have, err := scrape(ctx, url)
		if err != nil {
			return err.Error()
		}
		missing = missing[:0]
		for name := range want {
			if !have[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return fmt.Sprintf("%d metrics missing", len(missing))
		}
		return ""
	})
	if why != "" {
		sort.Strings(missing)
		var b strings.Builder
		for _, name := range missing {
			fmt.Fprintf(&b, "\n  %s (used by %s)", name, strings.Join(want[name], "; "))
		}
		t.Fatalf("%s at %s after %v:%s", why, url, metricsWaitTime, b.String())
	}
}

// scrape reads the names of the samples a /metrics endpoint serves (its
// text format: histogram samples are name_bucket, name_sum, name_count).
func scrape(ctx context.Context, url string) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("scrape %s: %s: %s", url, resp.Status, b)
	}
	have := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			have[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return have, nil
}

// query is one PromQL expression and where it is used.
type query struct{ where, expr string }

// ruleGroups is a Prometheus rule file's shape.
type ruleGroups struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

var (
	forRE       = regexp.MustCompile(`^[0-9]+[smhdwy]$`)
	severities  = []string{"critical", "warning", "info"}
	labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
)

// monitoringExprs reads and checks the dashboard and the rule files, and
// returns every query in them.
func monitoringExprs(t *testing.T) []query {
	t.Helper()
	var prometheusRule struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
		Spec       ruleGroups        `json:"spec"`
	}
	readYAML(t, alertsFile, &prometheusRule)
	if prometheusRule.APIVersion != "monitoring.coreos.com/v1" || prometheusRule.Kind != "PrometheusRule" || prometheusRule.Metadata.Name == "" {
		t.Errorf("%s: apiVersion %q kind %q name %q, want a named monitoring.coreos.com/v1 PrometheusRule",
			alertsFile, prometheusRule.APIVersion, prometheusRule.Kind, prometheusRule.Metadata.Name)
	}
	var plain ruleGroups
	readYAML(t, ruleFile, &plain)
	if !reflect.DeepEqual(plain, prometheusRule.Spec) {
		t.Errorf("%s and the spec of %s differ: keep the same groups in both", ruleFile, alertsFile)
	}
	var qs []query
	seen := map[string]bool{}
	for _, g := range prometheusRule.Spec.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("%s: group %q: want a name and rules", alertsFile, g.Name)
		}
		for _, r := range g.Rules {
			where := fmt.Sprintf("alert %s", r.Alert)
			switch {
			case r.Alert == "":
				t.Errorf("%s: group %s: a rule without alert: (recording rules do not belong here): %+v", alertsFile, g.Name, r)
			case seen[r.Alert]:
				t.Errorf("%s: alert %s defined twice", alertsFile, r.Alert)
			case strings.TrimSpace(r.Expr) == "":
				t.Errorf("%s: %s has no expr", alertsFile, where)
			case !forRE.MatchString(r.For):
				t.Errorf("%s: %s has for: %q, want a duration such as 5m", alertsFile, where, r.For)
			case !slices.Contains(severities, r.Labels["severity"]):
				t.Errorf("%s: %s has severity %q, want one of %v", alertsFile, where, r.Labels["severity"], severities)
			case r.Annotations["summary"] == "" || r.Annotations["description"] == "":
				t.Errorf("%s: %s needs annotations summary and description", alertsFile, where)
			}
			seen[r.Alert] = true
			qs = append(qs, query{where, r.Expr})
		}
	}

	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string  `json:"title"`
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Errorf("%s: want a title, a uid and panels", dashboardFile)
	}
	hasDatasource := false
	for _, v := range dash.Templating.List {
		switch {
		case v.Type == "datasource" && v.Name == "datasource":
			hasDatasource = true
		case v.Type == "query":
			s, _ := v.Query.(string)
			if q, ok := v.Query.(map[string]any); ok {
				s, _ = q["query"].(string)
			}
			if m := labelValues.FindStringSubmatch(s); m != nil {
				s = m[1]
			}
			qs = append(qs, query{"dashboard variable " + v.Name, s})
		}
	}
	if !hasDatasource {
		t.Errorf("%s: no datasource template variable named datasource", dashboardFile)
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if ds, _ := p.Datasource["uid"].(string); ds != "${datasource}" {
				t.Errorf("%s: panel %q datasource uid %q, want ${datasource}", dashboardFile, p.Title, ds)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: panel %q target %s has no expr", dashboardFile, p.Title, tg.RefID)
					continue
				}
				qs = append(qs, query{"panel " + p.Title, tg.Expr})
			}
		}
	}
	walk(dash.Panels)
	return qs
}

// panel is what the checks read of a Grafana panel; rows nest panels.
type panel struct {
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	Panels     []panel        `json:"panels"`
	Targets    []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
