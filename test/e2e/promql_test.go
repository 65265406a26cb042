package e2e

import (
	"regexp"
	"slices"
	"sort"
	"testing"
)

// metricNames returns the metric names a PromQL expression (or a Grafana
// query holding $variables) reads, sorted and without repeats.
//
// github.com/prometheus/prometheus is not in go.mod (its module graph is
// large), so this is a small lexer rather than the real parser. It drops
// string literals, label matchers ({...}), ranges and subqueries ([...]),
// Grafana variables ($x, ${x}), numbers and durations, and the label lists
// of by/without/on/ignoring/group_left/group_right; then every identifier
// that is not followed by "(" (a function or aggregation) and is not a
// keyword is a metric name.
//
// Limits: a metric selected only by {__name__="..."} is not found; a
// function name used as a metric name (rare, and legal) is taken for a
// function; label names in places other than the clauses above (e.g.
// label_replace's arguments are strings, so they are fine) would be taken
// for metrics. TestMonitoringConfigValid keeps the files within these
// limits by failing on a query in which it finds no metric.
func metricNames(expr string) []string {
	s := stringRE.ReplaceAllString(expr, " ")
	s = variableRE.ReplaceAllString(s, " ")
	s = matcherRE.ReplaceAllString(s, " ")
	s = rangeRE.ReplaceAllString(s, " ")
	s = clauseRE.ReplaceAllString(s, " ")
	var names []string
	for _, m := range tokenRE.FindAllStringSubmatchIndex(s, -1) {
		if m[2] < 0 { // a number or duration
			continue
		}
		id := s[m[2]:m[3]]
		rest := s[m[3]:]
		if followedByParen.MatchString(rest) || promqlKeywords[id] {
			continue
		}
		if !slices.Contains(names, id) {
			names = append(names, id)
		}
	}
	sort.Strings(names)
	return names
}

var (
	stringRE   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	variableRE = regexp.MustCompile(`\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*`)
	matcherRE  = regexp.MustCompile(`\{[^}]*\}`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	clauseRE   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// Numbers (1, 0.5, 1e3, 0x1f) and durations (5m) first, so that their
	// letters are not taken for identifiers.
	tokenRE         = regexp.MustCompile(`[0-9][0-9A-Za-z_.]*|([A-Za-z_:][A-Za-z0-9_:]*)`)
	followedByParen = regexp.MustCompile(`^\s*\(`)
	promqlKeywords  = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
		"Inf": true, "inf": true, "NaN": true, "nan": true, "start": true, "end": true,
	}
)

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		name, expr string
		want       []string
	}{
		{"a bare metric", "drover_hub_sessions", []string{"drover_hub_sessions"}},
		{"matchers and a rate over a Grafana interval", `sum by (kind, phase) (rate(a_total{phase="Offline",x=~"a|b"}[$__rate_interval]))`, []string{"a_total"}},
		{"a histogram quantile", "histogram_quantile(0.99, sum by (le, controller) (rate(x_bucket[5m])))", []string{"x_bucket"}},
		{"binary operators with on and group_left", `a / on (hub) group_left(node) b > 0.1 and c unless d`, []string{"a", "b", "c", "d"}},
		{"a subquery and offset", "deriv(sum(t{state=~\"Pending\"})[15m:1m]) > 0 and t offset 1h", []string{"t"}},
		{"absent, clamp_min and scientific numbers", "absent(m) or clamp_min(n, 1e3) > 0x1f", []string{"m", "n"}},
		{"strings with braces and identifiers", `label_replace(m, "dst", "$1 {x} y", "src", "(.*)")`, []string{"m"}},
		{"variables", "sum(x{instance=~\"$instance\"}) / ${scale}", []string{"x"}},
		{"without and bool", "count without (le) (a == bool 1)", []string{"a"}},
		{"a metric named like a keyword's prefix", "by_node_total + on_call", []string{"by_node_total", "on_call"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
				t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
}
