#!/usr/bin/env bash
# One command on a GPU machine (docs/kernels.md §6): the gpu-labelled kernel tests, a
# compute-sanitizer memcheck and racecheck pass on small cases, then kvpage_gpu_check (every
# kernel against the CPU reference on fresh random inputs, the device-to-device copy ceiling,
# a CUDA-event bandwidth sweep and the prefill TFLOP/s sweep), then kvpage_flashinfer_peer when
# it was built (FlashInfer's decode, then its batch prefill, on the same cache and sweeps, each
# after checking it agrees with kvpage's). Budget: under 5 minutes.
#
# Two ways to get the binaries:
#   scripts/gpu_check.sh --prebuilt DIR   # DIR made by scripts/gpu_bundle.sh on another machine:
#                                         # nothing is built or installed; needs only the driver
#                                         # (and compute-sanitizer, if the toolkit is there)
#   scripts/gpu_check.sh                  # builds the kernels-only project here (kernels/ as its
#                                         # own CMake project: CUDA toolkit + Abseil + GTest)
#   ... --allow-no-gpu                    # a dry run: no usable GPU is not an error
#
# Results (logs, bandwidth.csv, flashinfer*.csv) go to OUT_DIR: DIR/results with --prebuilt, else
# build/kernels-only/gpu_check. Never changes clocks or device settings. Exit status: 1 if any
# correctness check fails (a bandwidth row below target is reported, not fatal); 3, with one
# line saying which, when there is no usable GPU (no driver, a driver older than the CUDA
# runtime the binaries were built with, no device) or a test was skipped for want of one.
# With --allow-no-gpu those skip as they did before: the tests run and skip, exit 0.
set -euo pipefail
PREBUILT=""
ALLOW_NO_GPU=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) PREBUILT=$(cd "${2:?usage: $0 [--prebuilt DIR] [--allow-no-gpu]}" && pwd); shift 2 ;;
    --allow-no-gpu) ALLOW_NO_GPU=1; shift ;;
    *) echo "usage: $0 [--prebuilt DIR] [--allow-no-gpu]" >&2; exit 2 ;;
  esac
done
NO_GPU_FLAG=()
[ $ALLOW_NO_GPU -eq 1 ] && NO_GPU_FLAG=(--allow-no-gpu)

if [ -n "$PREBUILT" ]; then
  BIN_DIR="$PREBUILT/bin"
  OUT_DIR=${OUT_DIR:-$PREBUILT/results}
else
  cd "$(dirname "$0")/.."
  BUILD_DIR=${BUILD_DIR:-build/kernels-only}
  BIN_DIR="$BUILD_DIR/bin"
  OUT_DIR=${OUT_DIR:-$BUILD_DIR/gpu_check}
fi
mkdir -p "$OUT_DIR"
status=0

echo "== environment"
{
  date -u
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem \
    --format=csv || true
  nvcc --version 2>/dev/null | sed -n '4,5p' || true
  if [ -n "$PREBUILT" ]; then sed -n '1,5p' "$PREBUILT/MANIFEST" || true; fi
} 2>&1 | tee "$OUT_DIR/env.txt"

if [ -z "$PREBUILT" ]; then
  echo "== build (kernels only)"
  start=$(date +%s)
  cmake -S kernels -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > "$OUT_DIR/configure.log"
  cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc 2>/dev/null || echo 2)}" \
    --target kvpage_gpu_check kernels_gpu_test cuda_vmm_backing_gpu_test 2>&1 | tee "$OUT_DIR/build.log" | tail -3
  # kvpage_flashinfer_peer needs FlashInfer's headers here: see gpu_bundle.sh.
  echo "build took $(( $(date +%s) - start )) s"
fi

# Is there a GPU to check? Without one every test below would skip and the run would pass.
echo "== GPU probe"
if ! "$BIN_DIR/kvpage_gpu_check" --probe "${NO_GPU_FLAG[@]}" 2>&1 | tee "$OUT_DIR/probe.txt"; then
  echo "gpu_check.sh: $(tail -1 "$OUT_DIR/probe.txt" | sed 's/^FAIL: //') (exit 3; --allow-no-gpu for a dry run)"
  exit 3
fi

# A GoogleTest binary; its tests skip only when they find no usable GPU, so a skip fails the run
# (status 3) unless --allow-no-gpu.
run_gtest() {
  local name=$1 log=$2 rc=0 skipped
  "$BIN_DIR/$name" > "$log" 2>&1 || rc=$?
  tail -3 "$log"
  [ $rc -eq 0 ] || status=1
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\},.*/\1/p' "$log" | head -1)
  if [ "${skipped:-0}" -gt 0 ] && [ $ALLOW_NO_GPU -eq 0 ]; then
    echo "gpu_check.sh: $name skipped $skipped test(s): no usable GPU"
    no_gpu="$name skipped $skipped test(s): no usable GPU"
  fi
}
no_gpu=""

echo "== kernels_gpu_test (device vs CPU reference, fixed seeds: write_kv, paged_decode, paged_prefill, merge, copies)"
run_gtest kernels_gpu_test "$OUT_DIR/gtest.txt"

echo "== cuda_vmm_backing_gpu_test (KV cache on CUDA virtual memory: granules per chunk)"
run_gtest cuda_vmm_backing_gpu_test "$OUT_DIR/vmm.txt"

SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SANITIZER" ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool (small cases)"
    "$SANITIZER" --tool "$tool" --error-exitcode 1 "$BIN_DIR/kvpage_gpu_check" --quick \
      "${NO_GPU_FLAG[@]}" 2>&1 | tee "$OUT_DIR/$tool.txt" | tail -4 || status=1
  done
else
  echo "== compute-sanitizer not found: memcheck and racecheck skipped" | tee "$OUT_DIR/memcheck.txt"
fi

echo "== kvpage_gpu_check"
rc=0
"$BIN_DIR/kvpage_gpu_check" --csv "$OUT_DIR/bandwidth.csv" "${NO_GPU_FLAG[@]}" 2>&1 \
  | tee "$OUT_DIR/gpu_check.txt" || rc=$?
if [ $rc -eq 3 ]; then
  no_gpu=$(grep '^FAIL: no usable GPU' "$OUT_DIR/gpu_check.txt" | tail -1 | sed 's/^FAIL: //')
elif [ $rc -ne 0 ]; then
  status=1
fi

# FlashInfer's decode (GB/s) and batch prefill (TFLOP/s) on the same cache and sweeps.
for sweep in decode prefill; do
  log=flashinfer
  [ $sweep = decode ] || log=flashinfer_$sweep
  if [ -x "$BIN_DIR/kvpage_flashinfer_peer" ]; then
    echo "== kvpage_flashinfer_peer --only $sweep (FlashInfer's $sweep on the same cache and sweep)"
    "$BIN_DIR/kvpage_flashinfer_peer" --only $sweep --csv "$OUT_DIR/$log.csv" 2>&1 \
      | tee "$OUT_DIR/$log.txt" || status=1
  else
    echo "== no kvpage_flashinfer_peer in $BIN_DIR: FlashInfer $sweep peer skipped" \
      | tee "$OUT_DIR/$log.txt"
  fi
done

if [ -n "$no_gpu" ]; then
  echo "gpu_check.sh: $no_gpu (exit 3; results in $OUT_DIR)"
  exit 3
fi
echo "== results in $OUT_DIR (status $status)"
exit $status
