#!/usr/bin/env bash
# Creates (or reuses) the Python venv the KV event tests run routers and decoders from:
# NVIDIA Dynamo's standalone indexer and independent msgpack / ZeroMQ clients, pinned.
#
#   scripts/dynamo_venv.sh <venv dir>      (ctest runs it as the fixture DynamoVenv)
#
# A venv already there with the pinned versions is kept. KVPAGE_DYNAMO_VENV=<dir> names an
# existing venv to link instead of installing (offline machines); it must hold the same pins.
set -euo pipefail
VENV=$1
PINS=(ai-dynamo-runtime==1.6.1 msgpack==1.2.4 pyzmq==27.3.0)

has_pins() {
  local freeze
  freeze=$("$1/bin/python" -m pip freeze 2>/dev/null) || return 1
  for pin in "${PINS[@]}"; do
    grep -qix "${pin/_/-}" <<<"${freeze//_/-}" || return 1
  done
}

if [[ -x "$VENV/bin/python" ]] && has_pins "$VENV"; then
  echo "dynamo_venv: reusing $VENV"
  exit 0
fi
if [[ -n "${KVPAGE_DYNAMO_VENV:-}" ]]; then
  has_pins "$KVPAGE_DYNAMO_VENV" || { echo "dynamo_venv: $KVPAGE_DYNAMO_VENV lacks ${PINS[*]}" >&2; exit 1; }
  rm -rf "$VENV"
  ln -s "$(realpath "$KVPAGE_DYNAMO_VENV")" "$VENV"
  echo "dynamo_venv: linked $VENV -> $KVPAGE_DYNAMO_VENV"
  exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
has_pins "$VENV" || { echo "dynamo_venv: $VENV does not hold ${PINS[*]}" >&2; exit 1; }
echo "dynamo_venv: created $VENV"
