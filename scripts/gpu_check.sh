#!/usr/bin/env bash
# One command on a GPU machine (docs/kernels.md §6): build the CUDA targets, run the
# gpu-labelled tests, a compute-sanitizer memcheck pass on small cases, then kvpage_gpu_check
# (every kernel against the CPU reference on fresh random inputs, the device-to-device copy
# ceiling, and a CUDA-event bandwidth table). Budget: well under 5 minutes on a 16-core host.
#
#   scripts/gpu_check.sh            # results under build/gpu_check/
#   BUILD_DIR=b OUT_DIR=o scripts/gpu_check.sh
#
# Never changes clocks or device settings. Exit status is non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT_DIR=${OUT_DIR:-$BUILD_DIR/gpu_check}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$OUT_DIR"
status=0

echo "== environment"
{
  date -u
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem \
    --format=csv || true
  nvcc --version | tail -2 || true
} 2>&1 | tee "$OUT_DIR/env.txt"

echo "== build"
start=$(date +%s)
bash scripts/bootstrap.sh || echo "bootstrap failed (offline?); building with what is installed"
cmake -S . -B "$BUILD_DIR" -DKVPAGE_BUILD_CUDA=ON -DKVPAGE_BUILD_BENCHMARKS=OFF > "$OUT_DIR/configure.log"
cmake --build "$BUILD_DIR" -j "$JOBS" \
  --target kvpage_gpu_check kernels_gpu_test cuda_device_test kernel_reference_test \
    kernels_emulated_test \
  2>&1 | tee "$OUT_DIR/build.log" | tail -3
echo "build took $(( $(date +%s) - start )) s"

echo "== tests (CPU reference + gpu label)"
(cd "$BUILD_DIR" && ctest -R 'HalfConversion|KernelLayout|PlanDecode|RefTest|EmulatedKernels' --output-on-failure \
  && ctest -L gpu --output-on-failure) 2>&1 | tee "$OUT_DIR/ctest.txt" || status=1

SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SANITIZER" ]; then
  echo "== compute-sanitizer memcheck (small cases)"
  "$SANITIZER" --tool memcheck --error-exitcode 1 "$BUILD_DIR/bin/kvpage_gpu_check" --quick \
    2>&1 | tee "$OUT_DIR/memcheck.txt" | tail -5 || status=1
else
  echo "== compute-sanitizer not found: memcheck skipped"
fi

echo "== kvpage_gpu_check"
"$BUILD_DIR/bin/kvpage_gpu_check" --csv "$OUT_DIR/bandwidth.csv" 2>&1 \
  | tee "$OUT_DIR/gpu_check.txt" || status=1

echo "== results in $OUT_DIR (status $status)"
exit $status
