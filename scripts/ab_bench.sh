#!/usr/bin/env bash
# Interleaved A/B timing of two or more kvpage_benchmarks binaries: each round runs every
# binary once (5 short repetitions, pinned to one core), so slow phases of a shared machine hit
# all of them alike. Prints, per binary and benchmark, the minimum CPU time over all runs
# (interference can only add time) and the median.
#
#   scripts/ab_bench.sh FILTER ROUNDS BINARY...
#   scripts/ab_bench.sh 'ScheduleUpdate/qwen3_8b/requests:1024' 4 old/bin/kvpage_benchmarks build/bin/kvpage_benchmarks
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
FILTER=$1
ROUNDS=$2
shift 2
CORE=${CORE:-1}
for _ in $(seq "$ROUNDS"); do
  for b in "$@"; do
    taskset -c "$CORE" "$b" --benchmark_filter="$FILTER" --benchmark_min_time=0.05 \
      --benchmark_repetitions=5 2>/dev/null |
      awk -v b="$b" '/^BM_/ && !/_(mean|median|stddev|cv) / {print b, $1, $4, $5}'
  done
done | python3 -c '
import collections, sys
runs = collections.defaultdict(list)
unit = {}
for line in sys.stdin:
    binary, name, value, u = line.split()
    runs[(binary, name)].append(float(value))
    unit[(binary, name)] = u
for (binary, name), xs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    xs.sort()
    print(f"{name:62s} {binary:40s} min {xs[0]:9.1f}  median {xs[len(xs)//2]:9.1f} {unit[(binary, name)]}  n={len(xs)}")
'
