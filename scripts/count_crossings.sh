#!/usr/bin/env bash
# Counts what one crossing of the all-crossing decode step costs, under callgrind:
# instructions and simulated L1 data misses inside AllocateDecodeStep per crossing, over the
# BM_AllocateDecodeStep benchmark in which every request crosses into a new block
# (`--toggle-collect` limits the count to the call; the untimed work between steps is left
# out). The scratch vectors' first growth (std::vector::_M_default_append and the memset that
# zeroes the byte vector), which only the first call of each benchmark run pays, is
# subtracted. Exact and repeatable to a few tenths of
# an instruction (the number of calls depends on how long the benchmark runs under valgrind).
#
#   scripts/count_crossings.sh [benchmark=qwen3_8b] [requests=1024] [cross=1]
#   BUILD_DIR=other-build scripts/count_crossings.sh gemma3_4b
#
# With cross = 0 it counts the step in which no request crosses a block (per request).
#
# Needs valgrind (Debian: apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
MODEL=${1:-qwen3_8b}
REQUESTS=${2:-1024}
CROSS=${3:-1}
[ "$CROSS" = 0 ] || [ "$CROSS" = 1 ] || { echo "count_crossings.sh: cross must be 0 or 1, not $CROSS" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "count_crossings.sh: valgrind is not installed" >&2; exit 2; }
BIN="$BUILD_DIR/bin/kvpage_benchmarks"
[ -x "$BIN" ] || cmake --build "$BUILD_DIR" --target kvpage_benchmarks
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
valgrind --tool=callgrind --cache-sim=yes \
  --toggle-collect='kvpage::KvCacheManager::AllocateDecodeStep*' --callgrind-out-file="$OUT/cg" \
  "$BIN" --benchmark_filter="BM_AllocateDecodeStep/$MODEL/requests:$REQUESTS/cross:$CROSS\$" \
  --benchmark_min_time=0.01 >/dev/null 2>&1
calls=$(callgrind_annotate --tree=calling --inclusive=yes "$OUT/cg" 2>/dev/null |
  grep "kvpage::KvCacheManager::AllocateDecodeStep" |
  grep -o "([0-9]*x)" | head -1 | tr -d '()x')
callgrind_annotate --inclusive=yes --show=Ir,D1mr,D1mw "$OUT/cg" 2>/dev/null |
  python3 -c '
import re, sys
calls, requests = int(sys.argv[1]), int(sys.argv[2])
what = "crossing" if sys.argv[3] == "1" else "request (none crossing)"
total, growth = None, [0, 0, 0]
for line in sys.stdin:
    nums = [int(x.replace(",", "")) for x in re.findall(r"([\d,]+) \(", line)]
    if "PROGRAM TOTALS" in line:
        total = nums
    elif len(nums) == 3 and (("_M_default_append(unsigned long) [" in line and
                              "vector.tcc" in line) or "memset" in line):
        growth = [a + b for a, b in zip(growth, nums)]
n = calls * requests
print("%d calls of %d requests: %.1f instructions, %.2f L1 data misses per %s" % (
    calls, requests, (total[0] - growth[0]) / n, (total[1] + total[2] - growth[1] - growth[2]) / n,
    what))
' "$calls" "$REQUESTS" "$CROSS"
