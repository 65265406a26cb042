#!/bin/bash
# agent-rss.sh: idle RSS of real drover-agent builds, side by side in one run.
#
# bench/fleet's -real-agent-idle measures one agent next to thousands of
# simulated ones; this runs just that part: a control plane, one hub, and
# one real agent per NAME=BINARY argument, all started together, idle (30 s
# heartbeats), printing each agent's VmRSS = RssAnon + RssFile every
# STEP (default 60 s) for MINUTES (default 10), then its CPU time.
# Each binary is copied first, so no two agents share the pages of one file
# (a node runs one agent).
#
#   BIN_DIR=/path/with/drover bench/fleet/agent-rss.sh before=/tmp/a-old after=/tmp/a-new
#   (from the repository root; build agents with
#    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /tmp/a-new ./cmd/drover-agent)
set -u
B=${BIN_DIR:?set BIN_DIR to a directory holding drover}
W=${WORK:-$(mktemp -d)}
[ $# -gt 0 ] || { echo "usage: $0 NAME=AGENT_BINARY..." >&2; exit 2; }
mkdir -p "$W"
$B/drover controlplane --data-dir $W/cp --port 0 --crd-dir config/crd/bases --log-level warn > $W/cp.log 2>&1 &
CP=$!
for i in $(seq 120); do grep -q "ready kubeconfig=" $W/cp.log && break; sleep 1; done
K=$(sed -n 's/^ready kubeconfig=//p' $W/cp.log)
TOK=$($B/drover token create --kubeconfig $K --auto-approve --ttl 0 2>&1 | tail -1)
$B/drover hub --kubeconfig $K --hub-name rss --hub-listen 127.0.0.1:0 --log-level warn > $W/hub.log 2>&1 &
HUB=$!
for i in $(seq 120); do grep -q "ready hub=" $W/hub.log && break; sleep 1; done
ADDR=$(sed -n 's/^ready hub=//p' $W/hub.log)
$B/drover ca --kubeconfig $K > $W/ca.crt
declare -A PID
NAMES=()
for a in "$@"; do
  n=${a%%=*}; cp "${a#*=}" $W/agent-$n
  $W/agent-$n --node rss-$n --hub $ADDR --token $TOK --ca-file $W/ca.crt --state-dir $W/state-$n --log-level warn > $W/agent-$n.log 2>&1 &
  PID[$n]=$!; NAMES+=($n)
done
mib() { awk -v k=$2 '$1==k":" {printf "%.2f", $2/1024}' /proc/$1/status; }
echo "started $(date -u +%T); hub $ADDR; work dir $W"
printf "| min |"; for n in "${NAMES[@]}"; do printf " %s: RSS (anon + file) MiB |" $n; done; echo
STEP=${STEP:-60}
for t in $(seq $STEP $STEP $(( ${MINUTES:-10} * 60 ))); do
  sleep $STEP
  printf "| %s |" $(awk -v t=$t 'BEGIN {printf "%g", t/60}')
  for n in "${NAMES[@]}"; do p=${PID[$n]}; printf " %s (%s + %s) |" $(mib $p VmRSS) $(mib $p RssAnon) $(mib $p RssFile); done; echo
done
for n in "${NAMES[@]}"; do
  echo "$n: CPU $(awk -v hz=$(getconf CLK_TCK) '{split($0, a, ") "); split(a[2], f, " "); printf "%.2f s", (f[12]+f[13])/hz}' /proc/${PID[$n]}/stat)"
  kill ${PID[$n]}
done
wait "${PID[@]}" 2>/dev/null
kill $HUB; wait $HUB 2>/dev/null; kill $CP; wait $CP 2>/dev/null
