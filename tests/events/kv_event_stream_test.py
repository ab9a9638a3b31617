"""Every batch examples/server_loop publishes, decoded with Python's msgpack (not msgpack-c)
and checked against what vLLM 0.33 emits (vllm/distributed/kv_events.py):

  * framing: 3 frames [topic, 8-byte big-endian seq, payload], seq 0, 1, 2, ... on the PUB
    socket and on replay, which ends with seq -1 and an empty payload;
  * the batch: [ts float64, events, data_parallel_rank 0];
  * BlockStored keys, in order: type, block_hashes, parent_block_hash, token_ids, block_size,
    lora_id, medium, lora_name, group_idx, kv_cache_spec_kind (no extra_keys: msgspec omits
    None defaults); BlockRemoved: type, block_hashes, medium, group_idx;
  * values: unsigned 64-bit hashes, len(token_ids) = len(block_hashes) x block_size, a parent
    stored earlier and not removed since, removals of stored hashes only.

    python kv_event_stream_test.py <server_loop binary>
"""

import struct
import subprocess
import sys
import time

import msgpack
import zmq

STORED_KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
               "lora_id", "medium", "lora_name", "group_idx", "kv_cache_spec_kind"]
REMOVED_KEYS = ["type", "block_hashes", "medium", "group_idx"]
BLOCK_SIZE = 16


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check_batch(payload, held, counts):
    if payload[:2] != b"\x93\xcb":  # a 3-array whose first element is a float64
        fail(f"batch does not start [float64, ...]: {payload[:2].hex()}")
    ts, events, rank = msgpack.unpackb(payload, object_pairs_hook=list, use_list=True)
    if not isinstance(ts, float) or rank != 0 or not events:
        fail(f"batch head: ts {ts!r}, rank {rank!r}, {len(events)} events")
    for pairs in events:
        keys = [k for k, _ in pairs]
        e = dict(pairs)
        if e["type"] == "BlockStored":
            if keys != STORED_KEYS:
                fail(f"BlockStored keys {keys}")
            hashes = e["block_hashes"]
            if e["block_size"] != BLOCK_SIZE or len(e["token_ids"]) != len(hashes) * BLOCK_SIZE:
                fail(f"{len(hashes)} hashes, block_size {e['block_size']}, "
                     f"{len(e['token_ids'])} tokens")
            if (e["lora_id"], e["medium"], e["lora_name"], e["group_idx"],
                    e["kv_cache_spec_kind"]) != (None, "GPU", None, 0, "full_attention"):
                fail(f"BlockStored fields {e}")
            parent = e["parent_block_hash"]
            if parent is not None and parent not in held:
                fail(f"parent {parent} was never stored or was removed")
            for h in hashes:
                if not (isinstance(h, int) and 0 <= h < 2**64) or h in held:
                    fail(f"stored hash {h} is not a new unsigned 64-bit id")
                held.add(h)
            counts["stored"] += len(hashes)
            counts["multi"] += len(hashes) > 1
        elif e["type"] == "BlockRemoved":
            if keys != REMOVED_KEYS or e["medium"] != "GPU" or e["group_idx"] != 0:
                fail(f"BlockRemoved {pairs}")
            for h in e["block_hashes"]:
                if h not in held:
                    fail(f"removed hash {h} is not held")
                held.discard(h)
            counts["removed"] += len(e["block_hashes"])
        else:
            fail(f"unexpected event {pairs}")


def main():
    server = subprocess.Popen(
        [sys.argv[1], "--requests", "40", "--kv-budget-mib", "512", "--block-size",
         str(BLOCK_SIZE), "--kv-events-endpoint", "tcp://127.0.0.1:*",
         "--kv-events-replay-endpoint", "tcp://127.0.0.1:*", "--kv-events-topic", "kvpage",
         "--kv-events-linger-s", "30", "--kv-events-wait-s", "2"],
        stdout=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    try:
        line = server.stdout.readline().split()  # publishing KV events on E, replay on R
        pub, replay = line[4].rstrip(","), line[-1]
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub)
        for line in server.stdout:  # the run ends with the publisher's summary line
            if line.startswith("KV events:"):
                published = int(line.split()[2])
                break
        live = {}
        while sub.poll(1000):
            frames = sub.recv_multipart()
            if len(frames) != 3 or frames[0] != b"kvpage" or len(frames[1]) != 8:
                fail(f"PUB message of {len(frames)} frames")
            live[struct.unpack(">Q", frames[1])[0]] = frames[2]
        seqs = sorted(live)
        if not seqs or seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            fail(f"PUB sequence numbers not consecutive: {seqs[:5]}...")

        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay)
        dealer.send_multipart([b"", struct.pack(">Q", 0)])
        replayed = []
        while True:
            if not dealer.poll(10000):
                fail("replay timed out")
            empty, seq, payload = dealer.recv_multipart()
            if empty != b"" or len(seq) != 8:
                fail("replay framing")
            if not payload:
                if struct.unpack(">q", seq)[0] != -1:
                    fail("replay end marker is not -1")
                break
            replayed.append((struct.unpack(">Q", seq)[0], payload))
        if [s for s, _ in replayed] != list(range(published)):
            fail(f"replay gave {len(replayed)} batches, {published} were published")
        for s, payload in replayed:
            if s in live and live[s] != payload:
                fail(f"batch {s} differs between PUB and replay")
        held, counts = set(), {"stored": 0, "removed": 0, "multi": 0}
        for _, payload in replayed:
            check_batch(payload, held, counts)
        print(f"{published} batches ({len(live)} live on PUB, from seq {seqs[0]}), "
              f"{counts['stored']} blocks stored ({counts['multi']} events with several), "
              f"{counts['removed']} removed, {len(held)} held at the end")
        if counts["removed"] == 0 or counts["multi"] == 0:
            fail("the run neither evicted nor coalesced")
    finally:
        server.kill()
        server.wait()
        ctx.destroy(linger=0)
    print("PASS")


if __name__ == "__main__":
    main()
