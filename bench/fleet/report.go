package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/drover-fleet/drover/bench/internal/benchproc"
)

// Goals from the issue.
const (
	goalAgents        = 10000
	goalWritesPerNode = 0.2 // apiserver writes per idle node per minute
	goalAgentRSSMiB   = 15.0
)

func verdict(ok bool) string {
	if ok {
		return "pass"
	}
	return "MISS"
}

func (r *runner) report(res *hubResult, base *baseline) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	nodes := res.agents + res.realAgents
	mins := res.window.Minutes()
	perNodeMin := func(n float64) float64 { return n / float64(nodes) / mins }

	p("## fleet: one hub, %s simulated agents\n\n", thousands(int64(res.agents)))
	p("- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	p("- Machine: %s\n", r.machine)
	p("- Go: %s; command: `go run ./bench/fleet -agents %d -idle %s -baseline-idle %s`\n", r.goVer, r.o.agents, r.o.idle, r.o.baselineIdle)
	p("- Hub: defaults (heartbeat 30s, offline timeout 5m, lastHeartbeatTime refresh 10m, client QPS 50); agents in %d agentsim process(es), %d registering at once each\n",
		(res.agents+r.o.perProc-1)/r.o.perProc, r.o.concurrency)
	p("- Idle window: %s after every agent was connected (plus %d real drover-agent)\n\n", res.window.Round(time.Second), res.realAgents)

	p("| figure | measured | baseline (echo hub) | ratio | goal | |\n")
	p("|---|---:|---:|---:|---:|---|\n")

	held := res.minSessions
	heldNote := fmt.Sprintf("%s of %s", thousands(held), thousands(int64(nodes)))
	heldVerdict := verdict(held >= int64(nodes) && held >= goalAgents)
	if res.agents < goalAgents {
		heldVerdict = "n/a (run size)"
		if held < int64(nodes) {
			heldVerdict = "MISS"
		}
	}
	baseHeld, baseRate, rateRatio := "", "", ""
	rate := float64(res.agents) / res.connect.Seconds()
	if base != nil {
		baseHeld = fmt.Sprintf("%s of %s", thousands(base.sessions), thousands(int64(base.agents)))
		br := float64(base.agents) / base.connect.Seconds()
		baseRate = fmt.Sprintf("%.1f /s", br)
		rateRatio = fmt.Sprintf("%.3fx", rate/br)
	}
	p("| agents held through the idle window (min hub sessions) | %s | %s | | %s | %s |\n", heldNote, baseHeld, thousands(goalAgents), heldVerdict)
	p("| FleetNodes Online after the window | %s of %s | | | | |\n", thousands(int64(res.online)), thousands(int64(res.nodes)))
	p("| registration + connect rate (from start, all agents) | %.1f /s (%s) | %s | %s | | |\n", rate, res.connect.Round(time.Second), baseRate, rateRatio)

	rssRatio, cpuRatio, baseRSS, baseCPU := "", "", "", ""
	if base != nil {
		baseRSS = fmt.Sprintf("%.0f MiB (%.1f KiB/agent)", mib(base.rssKiB), float64(base.rssKiB)/float64(base.agents))
		baseCPU = fmt.Sprintf("%.2f%%", base.cpuPct)
		rssRatio = fmt.Sprintf("%.2fx", float64(res.hubRSSKiB)/float64(base.rssKiB))
		if base.cpuPct > 0 {
			cpuRatio = fmt.Sprintf("%.2fx", res.hubCPUPct/base.cpuPct)
		}
	}
	p("| hub RSS at the end of the window | %.0f MiB (%.1f KiB/agent; max %.0f MiB, peak VmHWM %.0f MiB) | %s | %s | | |\n",
		mib(res.hubRSSKiB), float64(res.hubRSSKiB)/float64(nodes), mib(res.hubRSSMaxKiB), mib(res.hubHWM), baseRSS, rssRatio)
	p("| hub CPU over the window (%% of one core) | %.2f%% (%.3f%% per 1,000 agents) | %s | %s | | |\n",
		res.hubCPUPct, res.hubCPUPct/float64(nodes)*1000, baseCPU, cpuRatio)

	fleetW := res.apiWrites["fleetnodes/status"] + res.apiWrites["fleetnodes"]
	allW := benchproc.Total(res.apiWrites)
	p("| FleetNode writes per idle node per minute | %.3f (%s writes) | | | ≤ %.1f | %s |\n",
		perNodeMin(fleetW), thousands(int64(fleetW)), goalWritesPerNode, verdict(perNodeMin(fleetW) <= goalWritesPerNode))
	p("| all apiserver writes per idle node per minute | %.3f (%s writes) | | | ≤ %.1f | %s |\n",
		perNodeMin(allW), thousands(int64(allW)), goalWritesPerNode, verdict(perNodeMin(allW) <= goalWritesPerNode))
	expHB := float64(nodes) * res.window.Seconds() / 30
	p("| heartbeats the hub accepted in the window | %s (%.0f /s; expected ~%s) | | | | |\n",
		thousands(int64(res.heartbeats)), res.heartbeats/res.window.Seconds(), thousands(int64(expHB)))
	p("| simulated heartbeat round trip, mean | %.2f ms | | | | |\n", res.simHBMeanMs)
	p("| agent-side errors in the window (stream / heartbeat) | %d / %d | | | 0 | %s |\n",
		res.simStreamErrors, res.simHBErrors, verdict(res.simStreamErrors == 0 && res.simHBErrors == 0))
	if res.realAgents > 0 {
		p("| real drover-agent RSS after %s connected and idle | %.1f MiB (anon %.1f + file %.1f; peak %.1f MiB) | | | ≤ %.0f MiB | %s |\n",
			res.realIdle.Round(time.Second), mib(res.realRSSKiB), mib(res.realAnonKiB), mib(res.realFileKiB), mib(res.realHWMKiB),
			goalAgentRSSMiB, verdict(mib(res.realRSSKiB) <= goalAgentRSSMiB))
	}
	p("| control plane (etcd + kube-apiserver, one process) in the window | %.0f MiB, %.1f%% CPU | | | | |\n", mib(res.cpRSSKiB), res.cpCPUPct)
	simBase := ""
	if base != nil {
		simBase = fmt.Sprintf("%.1f KiB/agent, %.1f%% CPU", float64(base.simRSSKiB)/float64(base.agents), base.simCPUPct)
	}
	p("| agentsim processes in the window (all) | %.1f KiB/agent, %.1f%% CPU | %s | | | |\n",
		float64(res.simRSSKiB)/float64(res.agents), res.simCPUPct, simBase)
	p("\n")

	p("apiserver writes in the idle window, by resource: %s\n\n", fmtCounts(res.apiWrites))
	p("hub FleetNode writes in the idle window, by reason (drover_hub_api_writes_total): %s\n\n", fmtCounts(res.hubWrites))
	p("During the ramp (start to window): apiserver writes %s; hub writes by reason %s (%.1f per node)\n\n",
		fmtCounts(res.apiWritesRamp), fmtCounts(res.hubWritesRamp), benchproc.Total(res.hubWritesRamp)/float64(nodes))
	if base != nil {
		p("Baseline: agentsim's echo hub (same gRPC server options and TLS, certificates signed in memory, no API) with the same %s agents, idle window %s, %s heartbeats.\n",
			thousands(int64(base.agents)), base.window.Round(time.Second), thousands(base.heartbeats))
	}
	return b.String()
}

func fmtCounts(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %s", k, thousands(int64(m[k]))))
	}
	return strings.Join(parts, ", ")
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
