#!/usr/bin/env bash
# Builds the libFuzzer harnesses in fuzz/ with clang 16 (ASan + UBSan) and runs each for a
# bounded time, starting from its seed corpus. New inputs that found coverage go to a work
# corpus under the build directory, not into the repository: copy the interesting ones into
# fuzz/corpus/<harness>/ by hand (the replay tests then keep them passing).
#
#   scripts/fuzz.sh                 every harness, FUZZ_SECONDS (default 60) each
#   scripts/fuzz.sh config flags    only these harnesses
#
# Settings (environment): FUZZ_SECONDS, FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS
# (parallel compile jobs, default nproc), CLANG_VERSION (default 16).
# Needs clang-16 (Debian: apt-get install clang-16; scripts/bootstrap.sh installs it with
# KVPAGE_FUZZ_DEPS=1). clang 14 cannot compile the tree.
set -euo pipefail

cd "$(dirname "$0")/.."
SECONDS_EACH="${FUZZ_SECONDS:-60}"
BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"
JOBS="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}"
VER="${CLANG_VERSION:-16}"
ALL=(config gpu trace_mooncake trace_azure trace_lengths flags manager_ops scheduler_steps memory
     cost_batch)
HARNESSES=("$@")
if ((${#HARNESSES[@]} == 0)); then HARNESSES=("${ALL[@]}"); fi

if ! command -v "clang++-${VER}" >/dev/null; then
  echo "fuzz.sh: clang++-${VER} not found; install it with" \
       "'KVPAGE_FUZZ_DEPS=1 bash scripts/bootstrap.sh' or 'apt-get install clang-${VER}'" >&2
  exit 2
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="clang-${VER}" -DCMAKE_CXX_COMPILER="clang++-${VER}" "${launcher[@]}" \
  -DKVPAGE_SANITIZE=ON -DKVPAGE_FUZZ=ON -DKVPAGE_BUILD_CUDA=OFF -DKVPAGE_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
targets=()
for h in "${HARNESSES[@]}"; do targets+=("fuzz_${h}"); done
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"

dict_of() {
  case "$1" in
    config|gpu|trace_mooncake) echo "fuzz/dict/json.dict" ;;
    trace_azure|trace_lengths) echo "fuzz/dict/csv.dict" ;;
    manager_ops|scheduler_steps|memory) echo "fuzz/dict/$1.dict" ;;
    flags|cost_batch) echo "fuzz/dict/flags.dict" ;;
  esac
}

failed=()
for h in "${HARNESSES[@]}"; do
  work="$BUILD_DIR/fuzz-corpus/$h"
  mkdir -p "$work" "$BUILD_DIR/fuzz-artifacts/$h"
  echo "fuzz.sh: $h for ${SECONDS_EACH}s" >&2
  # -rss_limit_mb: an input that makes a reader take more than 1 GiB is a finding too.
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       "$BUILD_DIR/bin/fuzz_${h}" "$work" "fuzz/corpus/$h" -dict="$(dict_of "$h")" \
         -max_total_time="$SECONDS_EACH" -rss_limit_mb=1024 -timeout=10 -max_len=65536 \
         -artifact_prefix="$BUILD_DIR/fuzz-artifacts/$h/" -print_final_stats=1; then
    failed+=("$h")
  fi
done
if ((${#failed[@]} > 0)); then
  echo "fuzz.sh: failures in ${failed[*]} (inputs in $BUILD_DIR/fuzz-artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: no failure in ${HARNESSES[*]}" >&2
