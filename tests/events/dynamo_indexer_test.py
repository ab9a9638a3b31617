"""NVIDIA Dynamo's standalone KV indexer mirrors a kvpage server's prefix cache.

Run by ctest with the pinned venv's python (scripts/dynamo_venv.sh):

    python dynamo_indexer_test.py <kv_events_driver binary>

Starts `python -m dynamo.indexer` on a free port and kv_events_driver (a Scheduler on qwen3-8b
with a small KV budget, publishing through KvEventPublisher). Phase 0 runs before the driver is
registered with the indexer, so its batches never reach the indexer's SUB socket: the indexer
must see the gap in sequence numbers and replay them from the driver's ROUTER socket. Phases 1
and 2 add shared prefixes, evictions and aborts. After each phase, for every prompt the
indexer's overlap (POST /query) must equal kvpage's own cached prefix in tokens.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

MODEL = "qwen3-8b"
WORKER = 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_healthy(port, proc, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"indexer exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit("indexer never became healthy")


def wait_connected(endpoint, seconds=30):
    """Waits until a TCP peer (the indexer's SUB socket) is connected to the bound endpoint.

    PUB drops what it sends before a subscriber is there; the indexer notices the gap only
    when a later batch arrives, so the phases after registration wait for the connection.
    """
    port = int(endpoint.rsplit(":", 1)[1])
    deadline = time.time() + seconds
    while time.time() < deadline:
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if int(local.split(":")[1], 16) == port and state == "01":  # ESTABLISHED
                    time.sleep(0.5)  # the subscription follows the handshake
                    return
        time.sleep(0.1)
    sys.exit(f"nothing connected to {endpoint}")


def overlap(port, tokens):
    status, body = post(port, "/query", {"token_ids": tokens, "model_name": MODEL})
    if status == 404:
        return 0  # no indexer for the model yet: nothing known
    assert status == 200, (status, body)
    return body["scores"].get(str(WORKER), {}).get("0", 0)


def check(port, report, label, seconds=30):
    """Waits (the indexer applies events asynchronously) until every overlap is right."""
    queries = report["queries"]
    deadline = time.time() + seconds
    while True:
        wrong = [(q["expected"], overlap(port, q["tokens"])) for q in queries]
        wrong = [(i, e, got) for i, (e, got) in enumerate(wrong) if e != got]
        if not wrong or time.time() > deadline:
            break
        time.sleep(0.5)
    expected_total = sum(q["expected"] for q in queries)
    print(f"{label}: {len(queries)} queries, {expected_total} cached tokens expected, "
          f"{len(wrong)} wrong; {report['stats']}")
    for i, e, got in wrong[:10]:
        print(f"  query {i} ({len(queries[i]['tokens'])} tokens): kvpage {e}, indexer {got}")
    return not wrong and expected_total > 0


def main():
    driver_bin = sys.argv[1]
    port = free_port()
    indexer = subprocess.Popen(
        [sys.executable, "-m", "dynamo.indexer", "--port", str(port), "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=open(os.environ.get("KVPAGE_INDEXER_LOG", os.devnull), "w"))
    driver = subprocess.Popen([driver_bin], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    ok = True
    try:
        wait_healthy(port, indexer)
        hello = json.loads(driver.stdout.readline())

        def phase(k):
            driver.stdin.write(f"phase {k}\n")
            driver.stdin.flush()
            return json.loads(driver.stdout.readline())

        before = phase(0)  # published before anyone listens: only replay can recover it
        status, body = post(port, "/register", {
            "instance_id": WORKER, "endpoint": hello["endpoint"],
            "replay_endpoint": hello["replay_endpoint"], "model_name": MODEL,
            "block_size": hello["block_size"]})
        assert status in (200, 201), (status, body)
        wait_connected(hello["endpoint"])
        for k in (1, 2):
            report = phase(k)
            ok &= check(port, report, f"phase {k}")
        stats = report["stats"]
        # The indexer asked for the batches of phase 0, which it never received.
        ok &= stats["replay_requests"] >= 1
        ok &= before["stats"]["published_batches"] > 0 and stats["dropped_batches"] == 0
        ok &= stats["removed_blocks"] > 0  # evictions happened
        print(f"replay requests {stats['replay_requests']}, "
              f"batches {stats['published_batches']}, removed blocks {stats['removed_blocks']}")
        driver.stdin.write("quit\n")
        driver.stdin.flush()
        ok &= driver.wait(timeout=30) == 0
    finally:
        for p in (driver, indexer):
            if p.poll() is None:
                p.kill()
                p.wait()
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
