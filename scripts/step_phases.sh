#!/usr/bin/env bash
# Where the wall time of one steady decode step of the scheduler goes, phase by phase: builds
# kvpage_step_counter with -DKVPAGE_STEP_PHASES=ON in a build directory of its own (the normal
# build records nothing), runs it RUNS times pinned to one core, and prints each phase's
# minimum over the runs (interference on a shared machine only adds time). Phases nest: the
# indented ones are parts of the one above (src/internal/step_phases.h). The build is
# Release (-O3); `make build` and the benchmarks are RelWithDebInfo (-O2).
#
#   scripts/step_phases.sh [model=qwen3-8b] [requests=1024] [steps=2000]
#   RUNS=9 CORE=0 scripts/step_phases.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-qwen3-8b}
REQUESTS=${2:-1024}
STEPS=${3:-2000}
RUNS=${RUNS:-5}
CORE=${CORE:-1}
BUILD_DIR=${BUILD_DIR:-build-phases}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKVPAGE_STEP_PHASES=ON \
  -DKVPAGE_BUILD_TESTS=OFF -DKVPAGE_BUILD_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" --target kvpage_step_counter -j "$(nproc)" >/dev/null
for _ in $(seq "$RUNS"); do
  taskset -c "$CORE" "$BUILD_DIR/bin/kvpage_step_counter" "$MODEL" "$REQUESTS" "$STEPS"
done | python3 -c '
import re, sys
best, order = {}, []
for line in sys.stdin:
    m = re.match(r"phase (.*?)\s+([\d.]+) us per step", line)
    if not m: continue
    name, us = m.group(1), float(m.group(2))
    if name not in best: order.append(name); best[name] = us
    best[name] = min(best[name], us)
print(f"{sys.argv[1]}, {sys.argv[2]} requests: wall time per step, minimum of {sys.argv[3]} runs")
for name in order: print(f"  {name:<28} {best[name]:8.2f} us")
' "$MODEL" "$REQUESTS" "$RUNS"
