#!/usr/bin/env bash
# Builds the GPU check here and packs it into one folder that runs on a GPU machine with no
# package registry and no toolkit (docs/kernels.md §6):
#
#   scripts/gpu_bundle.sh [DIR]            # default DIR: build/gpu-bundle (ignored by git)
#   # then, on the GPU machine, with DIR carried there:
#   bash DIR/gpu_check.sh --prebuilt DIR      # exit 3 there if it finds no usable GPU
#   bash DIR/gpu_check.sh --prebuilt DIR --allow-no-gpu   # a dry run anywhere
#
# It configures the kernels-only project (kernels/CMakeLists.txt on its own: the kernels, their
# CPU references, the checks; needs the CUDA toolkit, Abseil and GoogleTest here, nothing else)
# with KVPAGE_STATIC_DEPS, so Abseil, GoogleTest, libstdc++, libgcc and cudart are linked
# statically and the binaries need only glibc and the NVIDIA driver. The folder holds
#   bin/kvpage_gpu_check  bin/kernels_gpu_test  bin/cuda_vmm_backing_gpu_test  gpu_check.sh
#   MANIFEST  ptxas.txt  [bin/kvpage_flashinfer_peer]
# and the script fails if a binary needs any other shared library or the folder passes 64 MiB.
#
# FlashInfer's decode and batch prefill as the sweeps' peers (bin/kvpage_flashinfer_peer) are
# added when its headers are found: KVPAGE_FLASHINFER_INCLUDE, else
# build/flashinfer/wheel/flashinfer/data/include, the include/ folder of the flashinfer-python
# wheel unpacked there (docs/kernels.md §6):
#   pip download --no-deps flashinfer-python==0.7.4 -d build/flashinfer
#   unzip -q build/flashinfer/*.whl 'flashinfer/data/include/*' 'flashinfer/data/cccl/*' \
#     -d build/flashinfer/wheel
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/gpu-bundle}
BUILD_DIR=${BUILD_DIR:-build/kernels-only}
JOBS=${JOBS:-2}
FI_INCLUDE=${KVPAGE_FLASHINFER_INCLUDE:-build/flashinfer/wheel/flashinfer/data/include}
targets=(kvpage_gpu_check kernels_gpu_test cuda_vmm_backing_gpu_test)
if [ -f "$FI_INCLUDE/flashinfer/attention/decode.cuh" ]; then
  FI_INCLUDE=$(cd "$FI_INCLUDE" && pwd)
  targets+=(kvpage_flashinfer_peer)
  echo "FlashInfer headers: $FI_INCLUDE (builds kvpage_flashinfer_peer)"
else
  echo "FlashInfer headers not found at $FI_INCLUDE: the bundle has no FlashInfer peer"
  FI_INCLUDE=""
fi

cmake -S kernels -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKVPAGE_STATIC_DEPS=ON \
  -DKVPAGE_PTXAS_VERBOSE=ON -DKVPAGE_FLASHINFER_INCLUDE="$FI_INCLUDE" ${CMAKE_FLAGS:-} > /dev/null
# Rebuild the CUDA objects so ptxas prints every kernel's resources into the log.
cmake --build "$BUILD_DIR" --target clean > /dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" \
  > "$BUILD_DIR/bundle_build.log" 2>&1 || { tail -30 "$BUILD_DIR/bundle_build.log"; exit 1; }

rm -rf "$DIR"
mkdir -p "$DIR/bin"
for b in "${targets[@]}"; do
  cp "$BUILD_DIR/bin/$b" "$DIR/bin/"
  strip --strip-debug "$DIR/bin/$b"
done
cp scripts/gpu_check.sh "$DIR/"
# Registers, spills and shared memory per kvpage kernel, as ptxas reported them for sm_90
# (FlashInfer's kernels, which have no ptxas -v, do not appear).
python3 scripts/ptxas_table.py < "$BUILD_DIR/bundle_build.log" > "$DIR/ptxas.txt"

# Only glibc and the dynamic loader may remain (libcuda.so is opened by cudart at run time).
allowed='^(linux-vdso|libc|libm|libdl|libpthread|librt|ld-linux-x86-64)\.so'
bad=0
for b in "$DIR"/bin/*; do
  while read -r lib _; do
    if ! [[ $lib =~ $allowed ]] && [[ $lib != /* ]]; then
      echo "$b needs $lib" >&2
      bad=1
    fi
  done < <(ldd "$b" | sed 's/^[[:space:]]*//')
done
[ $bad -eq 0 ] || { echo "bundle not self-contained" >&2; exit 1; }

glibc=$(ldd --version | awk 'NR == 1 {print $NF}')
{
  echo "kvpage GPU check bundle"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- kernels src/kernels_ref include || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $glibc"
  echo "nvcc: $(nvcc --version | sed -n '$p')"
  echo "run: bash gpu_check.sh --prebuilt <this folder>   (needs glibc >= $glibc and a driver for CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p') or newer; exit 3 without one)"
  echo
  for b in "$DIR"/bin/*; do
    echo "$(basename "$b"): $(stat -c %s "$b") bytes; needs: $(ldd "$b" | awk '{print $1}' | tr '\n' ' ')"
  done
} > "$DIR/MANIFEST"

bytes=$(du -sb "$DIR" | cut -f1)
echo "bundle: $DIR, $((bytes / 1024)) KiB"
[ "$bytes" -lt $((64 << 20)) ] || { echo "bundle over 64 MiB" >&2; exit 1; }
