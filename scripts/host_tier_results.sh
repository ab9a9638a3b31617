#!/usr/bin/env bash
# The "Host tier" table of docs/simulator.md: the whole Mooncake conversation trace (12,031
# requests) on one H100 with Qwen3-8B, without a host tier and with 128, 512 and 2048 GiB under
# each policy. Prints one Markdown row per run: prefix-hit rate, the share of hits loaded from
# the host tier, TTFT p50/p99, host-tier bytes moved per simulated second, and the hit tokens.
#
#   scripts/host_tier_results.sh [build/bin/kvpage] [sizes in GiB] [extra sim flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/bin/kvpage}
SIZES=${2:-"128 512 2048"}
EXTRA=${3:-}
TRACE=sim/data/traces/mooncake_conversation_trace.jsonl
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
row() {  # policy-label size flags...
  local label=$1 size=$2
  shift 2
  # shellcheck disable=SC2086
  "$BIN" sim --model qwen3-8b --gpu h100 --trace "$TRACE" --no-progress $EXTRA "$@" \
    --output-json "$TMP/out.json" > /dev/null 2>&1
  python3 - "$TMP/out.json" "$label" "$size" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["prefix_cache"]
h = d.get("host_tier", {})
host = h.get("host_hit_tokens", 0)
share = host / p["hit_tokens"] if p["hit_tokens"] else 0.0
print(f"| {sys.argv[3]} | {sys.argv[2]} | {100 * p['hit_rate']:.2f}% | {100 * share:.1f}% "
      f"| {d['median_ttft_ms'] / 1e3:.1f} | {d['p99_ttft_ms'] / 1e3:.1f} "
      f"| {h.get('bytes_per_s', 0) / 1e9:.2f} | {p['hit_tokens']:,} |")
PY
}
echo "| host GiB | policy | hit rate | from host | TTFT p50 (s) | TTFT p99 (s) | host GB/s | hit tokens |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
row none 0
for size in $SIZES; do
  for policy in write-through write-back; do
    row "$policy" "$size" --host-cache-gib "$size" --host-policy "$policy"
  done
done
