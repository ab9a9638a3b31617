"""Time kvpage.Scheduler driven from Python against the same steps driven from C++.

A server's decode loop over N running requests: each step is schedule() + update() with one
sampled token per request. The Python time counts only the two calls into kvpage (the
caller's own work, here making the token array, is excluded, as the issue asks); the C++
time is Scheduler::Schedule() + Update() in a C++ loop on the same scheduler
(Scheduler._native_steps). Rounds alternate between the two so both see the same state.

    PYTHONPATH=build/python build/venv/bin/python benchmarks/python/scheduler_loop.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import kvpage


def warm_scheduler(model: str, requests: int, prompt_len: int,
                   decode_steps: int) -> kvpage.Scheduler:
    """`requests` requests past their prompts: the next `decode_steps` steps are pure decode."""
    m = kvpage.load_model(model)
    # Accounting only (no memory behind it): room for every request's whole run, so that no
    # step preempts.
    per_request = kvpage.plan(m, contexts=[prompt_len + decode_steps + 64]).rows[0].reserved_bytes
    s = kvpage.Scheduler(
        m,
        kv_budget_bytes=requests * per_request * 11 // 10,
        max_num_seqs=requests,
        max_num_batched_tokens=max(8192, requests),
        hash_seed=0,
    )
    rng = np.random.default_rng(0)
    for _ in range(requests):
        s.add_request(rng.integers(0, 30000, size=prompt_len).tolist(), max_new_tokens=1 << 20)
    for _ in range(100_000):
        out = s.schedule()
        decoding = out.one_sample_each and out.num_requests == requests
        sampling = int(np.count_nonzero(out.samples))
        s.update(out, np.full(sampling, 5, dtype=np.int32))
        if decoding:
            return s
    raise RuntimeError(f"{requests} requests never ran at once")


def python_steps(s: kvpage.Scheduler, steps: int, tokens: np.ndarray) -> float:
    inside = 0
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        out = s.schedule()
        t1 = time.perf_counter_ns()
        # The caller's work would go here (reading out.block_tables, running the model).
        t2 = time.perf_counter_ns()
        s.update(out, tokens)
        t3 = time.perf_counter_ns()
        inside += (t1 - t0) + (t3 - t2)
    return inside / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200, help="steps per round")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    s = warm_scheduler(args.model, args.requests, args.prompt_len,
                       2 * args.rounds * args.steps)
    tokens = np.full(args.requests, 5, dtype=np.int32)
    py_us, cpp_us = [], []
    for _ in range(args.rounds):
        py_us.append(python_steps(s, args.steps, tokens) / args.steps * 1e6)
        cpp_us.append(s._native_steps(args.steps, 5) / args.steps * 1e6)
    s.check_invariants()
    py, cpp = statistics.median(py_us), statistics.median(cpp_us)
    print(f"{args.model}, {args.requests} running decodes, {args.rounds} rounds of "
          f"{args.steps} steps (median per step)")
    print(f"  C++    Schedule() + Update():            {cpp:8.1f} us")
    print(f"  Python schedule() + update(), in kvpage: {py:8.1f} us")
    print(f"  ratio: {py / cpp:.2f}x")


if __name__ == "__main__":
    main()
