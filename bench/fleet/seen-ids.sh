#!/bin/bash
# seen-ids.sh: hub memory as the per-session sets of seen envelope ids fill.
#
# The hub remembers the last 512 envelope ids of each session (heartbeats
# included) to spot re-sends. At 30 s heartbeats a set fills in ~4.3 h, so
# bench/fleet's 10 min window never sees it. This runs N agents (default 500)
# heartbeating every HB (default 250ms), so the sets fill in about two
# minutes, and prints the hub's RSS and Go heap every 15-30 s.
#
#   BIN_DIR=/path/with/drover+agentsim bench/fleet/seen-ids.sh   # from the repository root
set -u
B=${BIN_DIR:?set BIN_DIR to a directory holding drover and agentsim}
W=${WORK:-$(mktemp -d)}
PORT=${PORT:-18391}
mkdir -p "$W"
$B/drover controlplane --data-dir $W/cp --port 0 --crd-dir config/crd/bases --log-level warn > $W/cp.log 2>&1 &
CP=$!
for i in $(seq 60); do grep -q "ready kubeconfig=" $W/cp.log && break; sleep 1; done
K=$(sed -n 's/^ready kubeconfig=//p' $W/cp.log)
TOK=$($B/drover token create --kubeconfig $K --auto-approve --ttl 0 2>&1 | tail -1)
$B/drover hub --kubeconfig $K --hub-name seen --hub-listen 127.0.0.1:0 --metrics-bind-address 127.0.0.1:$PORT --log-level warn > $W/hub.log 2>&1 &
HUB=$!
for i in $(seq 60); do grep -q "ready hub=" $W/hub.log && break; sleep 1; done
ADDR=$(sed -n 's/^ready hub=//p' $W/hub.log)
$B/drover ca --kubeconfig $K > $W/ca.crt
$B/agentsim -hub $ADDR -ca $W/ca.crt -token $TOK -agents ${N:-500} -src-first 200 -src-count 4 -concurrency 8 -heartbeat ${HB:-250ms} > $W/sim.log 2>&1 &
SIM=$!
rss() { grep VmRSS /proc/$HUB/status | awk '{print $2}'; }
heap() { curl -s 127.0.0.1:$PORT/metrics | awk '/^go_memstats_heap_inuse_bytes/ {h=$2} /^go_gc_heap_goal_bytes/ {g=$2} /^go_memstats_heap_alloc_bytes/ {a=$2} END {printf "%.0f heap_goal_kib=%.0f heap_alloc_kib=%.0f", h/1024, g/1024, a/1024}'; }
hb() { curl -s 127.0.0.1:$PORT/metrics | awk '/drover_hub_messages_received_total.*HEARTBEAT/ {print $2}'; }
for i in $(seq 600); do
  n=$(curl -s 127.0.0.1:$PORT/metrics | awk '/^drover_hub_sessions / {print $2}')
  [ "${n:-0}" = "${N:-500}" ] && break; sleep 2
done
echo "connected at $(date -u +%T)"
for t in 0 15 30 45 60 90 120 150 180 210; do
  [ $t -gt 0 ] && sleep $(( t <= 60 ? 15 : 30 ))
  echo "t=$t rss_kib=$(rss) heap_inuse_kib=$(heap) heartbeats=$(hb)"
done
kill $SIM; wait $SIM 2>/dev/null; kill $HUB; wait $HUB 2>/dev/null; kill $CP; wait $CP 2>/dev/null
