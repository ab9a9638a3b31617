#!/usr/bin/env bash
# Installs the Debian packages kvpage builds and runs with, and nothing else.
# Idempotent: when every package is present it only asks dpkg (well under a second).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libabsl-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libxxhash-dev libssl-dev
  libzmq3-dev libmsgpack-cxx-dev
  python3 python3-dev python3-matplotlib python3-venv
)
# Optional: clang 16 for the libFuzzer harnesses (scripts/fuzz.sh); make test does not need
# it. KVPAGE_FUZZ_DEPS=1 bash scripts/bootstrap.sh adds it.
if [[ "${KVPAGE_FUZZ_DEPS:-0}" == "1" ]]; then
  PACKAGES+=(clang-16 libclang-rt-16-dev)
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
if [[ "$(id -u)" != "0" ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "bootstrap: done" >&2
