"""Shared fixtures: the kvpage CLI the Python results are compared with, and a GIL check."""

import json
import os
import subprocess
import threading
import time

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


@pytest.fixture
def assert_releases_gil():
    """Calls fn() while a thread stamps the clock in a loop. Were the GIL held during the
    call, the thread could run only at its edges (one switch interval each, 5 ms); released,
    its stamps cover the call."""

    def check(fn):
        stamps = []
        stop = threading.Event()

        def worker():
            while not stop.is_set():
                stamps.append(time.monotonic())

        thread = threading.Thread(target=worker)
        thread.start()
        try:
            start = time.monotonic()
            fn()
            end = time.monotonic()
        finally:
            stop.set()
            thread.join()
        inside = [t for t in stamps if start < t < end]
        assert end - start > 0.1, "the call is too short to tell"
        assert inside, "the thread made no progress during the call"
        assert inside[-1] - inside[0] > 0.5 * (end - start)

    return check
