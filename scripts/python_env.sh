#!/usr/bin/env bash
# Creates the virtual environment the build uses for the Python module (python/): VENV_DIR
# (default build/venv) with python/requirements-dev.txt from PyPI. CMake builds the module
# when it finds this environment, and ctest runs pytest in it. Idempotent: when the
# environment already has these requirements it only compares one file.
# KVPAGE_PYTHON=0 skips it (the module is then not built).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_DIR="${1:-build/venv}"
REQUIREMENTS=python/requirements-dev.txt
STAMP="$VENV_DIR/.kvpage-requirements"

if [[ "${KVPAGE_PYTHON:-1}" == "0" ]]; then exit 0; fi
if [[ -f "$STAMP" ]] && cmp -s "$STAMP" "$REQUIREMENTS"; then exit 0; fi

echo "python_env: creating $VENV_DIR ($(tr '\n' ' ' < <(grep -v '^#' "$REQUIREMENTS")))" >&2
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m venv "$VENV_DIR"
"$VENV_DIR/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
cp "$REQUIREMENTS" "$STAMP"
echo "python_env: done" >&2
