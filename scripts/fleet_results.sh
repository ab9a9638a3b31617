#!/usr/bin/env bash
# The "Fleet" table of docs/simulator.md: the full Mooncake conversation trace (12,031
# requests) on 4, 8 and 16 replicas of Qwen3-8B on an H100 under each router. Prints one
# Markdown row per run (hit rate, TTFT and TPOT p50/p99, load imbalance, KV event bytes per
# second, user CPU seconds of the run).
#
#   scripts/fleet_results.sh [build/bin/kvpage] [replica counts] [routers]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/bin/kvpage}
COUNTS=${2:-"4 8 16"}
ROUTERS=${3:-"round-robin least-loaded prefix-aware kv-events"}
TRACE=sim/data/traces/mooncake_conversation_trace.jsonl
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "| replicas | router | hit rate | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) | imbalance | events (KB/s) | CPU (s) |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in $COUNTS; do
  for r in $ROUTERS; do
    /usr/bin/time -f "%U" -o "$TMP/cpu" "$BIN" sim --model qwen3-8b --gpu h100 --trace "$TRACE" \
      --replicas "$n" --router "$r" --no-progress --output-json "$TMP/out.json" > /dev/null
    python3 - "$TMP/out.json" "$(cat "$TMP/cpu")" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"| {d['replicas']} | {d['router']} | {100 * d['prefix_cache']['hit_rate']:.2f}% "
      f"| {d['median_ttft_ms']:.1f} | {d['p99_ttft_ms']:.1f} "
      f"| {d['median_tpot_ms']:.2f} | {d['p99_tpot_ms']:.2f} "
      f"| {d['load_imbalance']:.3f} | {d['event_bytes_per_s'] / 1000:.1f} | {sys.argv[2]} |")
PY
  done
done
