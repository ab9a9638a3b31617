#!/usr/bin/env bash
# Counts what one steady decode step of the scheduler costs, under callgrind: instructions and
# simulated L1 data misses per request and step, and the functions that take the most
# instructions (inclusive). Exact and repeatable, unlike wall-clock time on a shared VM; use it
# to compare builds, then confirm with an interleaved timing run (scripts/ab_bench.sh).
#
#   scripts/count_step.sh [model=qwen3-8b] [requests=1024] [steps=64]
#   BUILD_DIR=other-build scripts/count_step.sh
#   KVPAGE_TREE=/path/to/old/checkout scripts/count_step.sh   # count another commit's library
#   CG_OUT=/tmp/step.cg scripts/count_step.sh                  # keep callgrind's output
#
# KVPAGE_TREE: a checkout of any commit whose library is built (KVPAGE_TREE/build/lib/
# libkvpage.a, or one libkvpage_<layer>.a per layer since the split); this tree's counter
# (benchmarks/decode_step_counter.cc: the public API only) is
# compiled against that checkout's headers and library, so two commits run the same driver.
# CG_OUT: the raw profile, for questions such as one function's misses:
#   callgrind_annotate --inclusive=yes --show=Ir,D1mr,D1mw "$CG_OUT" | grep CacheBlock
#
# Needs valgrind (Debian: apt-get install valgrind); builds kvpage_step_counter if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
MODEL=${1:-qwen3-8b}
REQUESTS=${2:-1024}
STEPS=${3:-64}
command -v valgrind >/dev/null || { echo "count_step.sh: valgrind is not installed" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
COUNTER="$BUILD_DIR/bin/kvpage_step_counter"
if [ -n "${KVPAGE_TREE:-}" ]; then
  COUNTER="$OUT/kvpage_step_counter"
  # shellcheck disable=SC2046  # pkg-config prints several flags
  LIBS=("$KVPAGE_TREE/build/lib/libkvpage.a")
  [ -f "${LIBS[0]}" ] || LIBS=("$KVPAGE_TREE"/build/lib/libkvpage_{scheduler,block,model}.a)
  g++ -O2 -g -std=c++20 -I"$KVPAGE_TREE/include" -Ibenchmarks -Isrc benchmarks/decode_step_counter.cc \
    -o "$COUNTER" "${LIBS[@]}" \
    $(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format absl_flat_hash_map) \
    -lxxhash -lcrypto -lpthread
else
  [ -x "$COUNTER" ] || cmake --build "$BUILD_DIR" --target kvpage_step_counter
fi
CG="${CG_OUT:-$OUT/cg}"
valgrind --tool=callgrind --instr-atstart=no --cache-sim=yes --callgrind-out-file="$CG" \
  "$COUNTER" "$MODEL" "$REQUESTS" "$STEPS" 2> "$OUT/log"
per=$((REQUESTS * STEPS))
python3 - "$OUT/log" "$per" "$STEPS" <<'PY'
import re, sys
log, per, steps = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
def total(label):
    m = re.search(label + r':\s+([\d,]+)', log)
    return int(m.group(1).replace(',', '')) if m else 0
ir, d1 = total('I   refs'), total('D1  misses')
print(f"instructions per step {ir // steps:,}   per request {ir / per:.1f}")
print(f"L1 data misses per step {d1 // steps:,}   per request {d1 / per:.2f}")
PY
echo "inclusive instructions per request, top functions (callgrind_annotate lists a function"
echo "once per source file its code came from; the largest entry is shown):"
callgrind_annotate --inclusive=yes --show=Ir "$CG" 2>/dev/null | python3 -c '
import re, sys
per = int(sys.argv[1]); shown = 0; seen = set()
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \([^)]*\)\s+\S+:(kvpage::\S+?)\(", line)
    if not m or m.group(2) in seen: continue
    seen.add(m.group(2))
    count = int(m.group(1).replace(",", ""))
    print("  %8.1f  %s" % (count / per, m.group(2)))
    shown += 1
    if shown == 12: break
' "$per"
