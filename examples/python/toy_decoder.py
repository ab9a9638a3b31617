"""A toy decoder in NumPy served through kvpage.Scheduler, checked against its dense run.

The model (random weights, single-head causal attention, a few layers) keeps its K and V in a
paged cache of its own: K[layer, slot] and V[layer, slot], where the scheduler's slot mapping
says where each new token's K/V goes and its block table says where a request's earlier
tokens are. Requests share prompt prefixes, so the prefix cache serves some prompts and a small
KV budget makes the scheduler preempt. Every request's tokens must equal what the same model
produces running the request alone, densely (no cache): they do when kvpage's tables are right.

    PYTHONPATH=build/python build/venv/bin/python examples/python/toy_decoder.py

Not here yet: sliding-window and linear-attention layers, and the host memory backing's
tensors (this cache is the example's own NumPy array).
"""

from __future__ import annotations

import argparse
from typing import Dict, List

import numpy as np

import kvpage


class ToyModel:
    """Embedding, `layers` residual single-head attention layers, an output projection."""

    def __init__(self, vocab: int = 97, dim: int = 32, layers: int = 2, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.vocab, self.dim, self.layers = vocab, dim, layers
        self.embed = rng.normal(size=(vocab, dim))
        self.wqkv = rng.normal(size=(layers, 3, dim, dim)) / np.sqrt(dim)
        self.out = rng.normal(size=(dim, vocab))

    def positions(self, pos: np.ndarray) -> np.ndarray:
        freq = 1.0 / (100.0 ** (np.arange(self.dim // 2) * 2 / self.dim))
        angle = pos[:, None] * freq[None, :]
        return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)

    def forward(self, tokens: np.ndarray, pos: np.ndarray, attend) -> np.ndarray:
        """Hidden states of `tokens` at positions `pos`; attend(layer, q, k, v) attends."""
        h = self.embed[tokens] + self.positions(pos)
        for layer in range(self.layers):
            q, k, v = (h @ self.wqkv[layer, i] for i in range(3))
            h = h + attend(layer, q, k, v)
        return h

    def next_token(self, h_last: np.ndarray) -> int:
        return int(np.argmax(h_last @ self.out))


def causal(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """Query i attends to keys 0..q_pos[i]."""
    scores = q @ k.T / np.sqrt(q.shape[1])
    mask = np.arange(len(k))[None, :] > q_pos[:, None]
    scores = np.where(mask, -np.inf, scores)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)) @ v


def dense_generate(model: ToyModel, prompt: List[int], max_new_tokens: int) -> List[int]:
    """The request alone, recomputing everything each token."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        pos = np.arange(len(tokens))
        h = model.forward(np.array(tokens), pos, lambda _l, q, k, v: causal(q, k, v, pos))
        tokens.append(model.next_token(h[-1]))
    return tokens[len(prompt):]


class PagedCache:
    """K and V of every layer by slot (block * block_size + offset), grown on demand."""

    def __init__(self, layers: int, dim: int):
        self.k = np.zeros((layers, 0, dim))
        self.v = np.zeros((layers, 0, dim))

    def ensure(self, slots: int) -> None:
        if slots > self.k.shape[1]:
            grow = ((0, 0), (0, max(slots, 2 * self.k.shape[1]) - self.k.shape[1]), (0, 0))
            self.k, self.v = np.pad(self.k, grow), np.pad(self.v, grow)

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        self.k[layer, slots] = k
        self.v[layer, slots] = v


def serve_step(model: ToyModel, cache: PagedCache, out: kvpage.StepOutput,
               history: Dict[int, List[int]]) -> np.ndarray:
    """Runs one scheduled batch; returns one sampled token per sampling request."""
    (table,) = out.block_tables
    (slot_mapping,) = out.slot_mappings
    block = out.attention_groups[0]["kernel_block_size"]
    cache.ensure(int(table.max() + 1) * block)
    sampled = []
    first = 0
    for rid, row, start, count, samples in zip(out.request_ids, out.rows,
                                               out.num_computed_tokens,
                                               out.num_scheduled_tokens, out.samples):
        pos = np.arange(start, start + count)
        tokens = np.array(history[int(rid)])[pos]
        new_slots = slot_mapping[first:first + count]
        first += count
        # Slots of positions 0 .. start + count - 1: where this request's keys are.
        all_pos = np.arange(start + count)
        slots = table[row, all_pos // block] * block + all_pos % block

        def attend(layer, q, k, v):
            cache.write(layer, new_slots, k, v)
            return causal(q, cache.k[layer, slots], cache.v[layer, slots], pos)

        h = model.forward(tokens, pos, attend)
        if samples:
            sampled.append(model.next_token(h[-1]))
    return np.array(sampled, dtype=np.int32)


def run(num_requests: int = 12, kv_budget_bytes: int = 40 << 20, seed: int = 0,
        cache_type: type = PagedCache) -> Dict[str, int]:
    """Serves the requests; returns {"equal": 0 or 1, "preemptions": n, "cached_tokens": n}."""
    model = ToyModel(seed=seed)
    rng = np.random.default_rng(seed)
    shared = [rng.integers(0, model.vocab, size=40).tolist() for _ in range(3)]
    prompts, lengths = [], []
    for i in range(num_requests):
        tail = rng.integers(0, model.vocab, size=int(rng.integers(1, 30))).tolist()
        prompts.append(shared[i % 3] + tail)
        lengths.append(int(rng.integers(1, 48)))

    # The scheduler's own model (Qwen3-8B, full attention) sizes the blocks; the toy model
    # reads the tables it produces. A small budget forces preemptions.
    s = kvpage.Scheduler(kvpage.load_model("qwen3-8b"), kv_budget_bytes=kv_budget_bytes,
                         max_num_batched_tokens=64, hash_seed=seed)
    history: Dict[int, List[int]] = {}
    for prompt, n in zip(prompts, lengths):
        history[s.add_request(prompt, max_new_tokens=n).id] = list(prompt)
    cache = cache_type(model.layers, model.dim)
    preempted = cached = 0
    while s.has_unfinished_requests:
        out = s.schedule()
        preempted += len(out.preempted_ids)
        tokens = serve_step(model, cache, out, history)
        sampling_ids = [int(r) for r, smp in zip(out.request_ids, out.samples) if smp]
        for rid, token in zip(sampling_ids, tokens):
            history[rid].append(int(token))
        cached += sum(f.num_cached_tokens for f in s.update(out, tokens))
    ok = True
    for rid, (prompt, n) in enumerate(zip(prompts, lengths)):
        # A request may stop early at max_model_len (the longest one the budget holds).
        paged = history[rid][len(prompt):]
        ok &= 1 <= len(paged) <= n and paged == dense_generate(model, prompt, len(paged))
    print(f"{num_requests} requests, {preempted} preemption(s), {cached} prompt tokens from the "
          f"prefix cache: tokens equal to the dense run: {ok}")
    return {"equal": int(ok), "preemptions": preempted, "cached_tokens": cached}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--kv-budget-mib", type=int, default=40)
    args = parser.parse_args()
    raise SystemExit(0 if run(args.requests, args.kv_budget_mib << 20)["equal"] else 1)
