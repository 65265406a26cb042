package benchproc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// sample is one line of the Prometheus text format.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Scrape fetches url with c and parses the samples whose names are in want
// (all if want is empty).
func Scrape(ctx context.Context, c *http.Client, url string, want ...string) ([]Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	var out []Sample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s, ok := parseSample(line)
		if !ok {
			continue
		}
		if len(want) > 0 && !contains(want, s.Name) {
			continue
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// parseSample parses `name{k="v",...} value [timestamp]`. Label values with
// escaped quotes are not expected in the series read here.
func parseSample(line string) (Sample, bool) {
	s := Sample{Labels: map[string]string{}}
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return s, false
		}
		s.Name = line[:i]
		for kv := range strings.SplitSeq(line[i+1:j], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if ok {
				s.Labels[strings.TrimSpace(k)] = strings.Trim(v, `"`)
			}
		}
		rest = line[j+1:]
	} else {
		f := strings.Fields(line)
		if len(f) < 2 {
			return s, false
		}
		s.Name, rest = f[0], strings.Join(f[1:], " ")
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return s, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return s, false
	}
	s.Value = v
	return s, true
}

// SumBy sums the samples named name, grouped by the label values key returns
// ("" drops a sample).
func SumBy(ss []Sample, name string, key func(map[string]string) string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		if k := key(s.Labels); k != "" {
			out[k] += s.Value
		}
	}
	return out
}

// APIWrites groups apiserver_request_total's mutating requests by resource
// (with subresource).
func APIWrites(ss []Sample) map[string]float64 {
	return SumBy(ss, "apiserver_request_total", func(l map[string]string) string {
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION":
		default:
			return ""
		}
		r := l["resource"]
		if l["subresource"] != "" {
			r += "/" + l["subresource"]
		}
		return r
	})
}

// Delta is b - a per key.
func Delta(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Total sums m.
func Total(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}
