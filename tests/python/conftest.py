"""Shared fixtures: the kvpage CLI the Python results are compared with."""

import json
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def cli():
    """Runs `kvpage ARGS` (ctest sets KVPAGE_CLI; else build/bin/kvpage) and parses its JSON."""
    binary = os.environ.get("KVPAGE_CLI", os.path.join(REPO, "build", "bin", "kvpage"))
    if not os.path.exists(binary):
        pytest.skip(f"no kvpage CLI at {binary}")

    def run(*args):
        out = subprocess.run([binary, *args], check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    return run
