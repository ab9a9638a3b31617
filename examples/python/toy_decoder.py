"""A toy hybrid decoder in NumPy served through kvpage.Scheduler, checked against its dense run.

The model (random weights, dim 32, float32 caches) has three layers: full causal attention,
sliding-window attention (each token reads itself and the 7 tokens before it) and a linear-
attention layer (a causal depthwise convolution over q, k and v, then a decaying k vᵀ state).
The example writes a config.json with those layer kinds, so kvpage's pools have the toy's
shapes, and the scheduler runs on the host backing (`backing="host"`): the K/V of the two
attention layers and the convolution and recurrent states of the third live in kvpage's memory
and the model reads and writes them through `Scheduler.cache()` views, at the step's slot
mappings, block tables and state slots. Requests share prompt prefixes, so the prefix cache
serves some prompts (the linear layer resumes from kvpage's state snapshots), and a small
budget makes the scheduler preempt. Every request's tokens must equal what the same model
produces running the request alone, densely (no cache): they do when kvpage's tables, slots
and memory are right.

    PYTHONPATH=build/python build/venv/bin/python examples/python/toy_decoder.py
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Dict, List

import numpy as np

import kvpage

KINDS = ("full_attention", "sliding_attention", "linear_attention")
WINDOW = 8  # sliding window: a token reads itself and the WINDOW - 1 tokens before it
CONV = 4    # linear attention's convolution kernel (its state keeps CONV - 1 inputs)
DECAY = 0.9


def f32(x: np.ndarray) -> np.ndarray:
    """What the float32 cache stores; both runs round here, so they compute the same values."""
    return x.astype(np.float32).astype(np.float64)


class ToyModel:
    """Embedding, one residual layer per kind in KINDS, an output projection."""

    def __init__(self, vocab: int = 97, dim: int = 32, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.vocab, self.dim, self.layers = vocab, dim, len(KINDS)
        self.embed = rng.normal(size=(vocab, dim))
        self.wqkv = rng.normal(size=(self.layers, 3, dim, dim)) / np.sqrt(dim)
        self.conv = rng.normal(size=(CONV, 3 * dim)) / np.sqrt(CONV)
        self.out = rng.normal(size=(dim, vocab))

    def config(self) -> dict:
        """A Hugging Face style config.json that kvpage reads as this model's layers."""
        return {
            "model_type": "toy_hybrid", "torch_dtype": "float32",
            "num_hidden_layers": self.layers, "hidden_size": self.dim,
            "intermediate_size": 2 * self.dim, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": self.dim, "vocab_size": self.vocab,
            "max_position_embeddings": 4096, "layer_types": list(KINDS),
            "sliding_window": WINDOW, "linear_conv_kernel_dim": CONV,
            "linear_num_key_heads": 1, "linear_key_head_dim": self.dim,
            "linear_num_value_heads": 1, "linear_value_head_dim": self.dim,
        }

    def positions(self, pos: np.ndarray) -> np.ndarray:
        freq = 1.0 / (100.0 ** (np.arange(self.dim // 2) * 2 / self.dim))
        angle = pos[:, None] * freq[None, :]
        return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)

    def forward(self, tokens: np.ndarray, pos: np.ndarray, mixer) -> np.ndarray:
        """Hidden states of `tokens` at positions `pos`; mixer(layer, q, k, v) mixes tokens."""
        h = self.embed[tokens] + self.positions(pos)
        for layer in range(self.layers):
            q, k, v = (f32(h @ self.wqkv[layer, i]) for i in range(3))
            h = h + mixer(layer, q, k, v)
        return h

    def next_token(self, h_last: np.ndarray) -> int:
        return int(np.argmax(h_last @ self.out))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
              k_pos: np.ndarray, window: int) -> np.ndarray:
    """Query i reads the keys at positions q_pos[i] - window + 1 .. q_pos[i] (window 0: all)."""
    scores = q @ k.T / np.sqrt(q.shape[1])
    mask = k_pos[None, :] > q_pos[:, None]
    if window:
        mask |= k_pos[None, :] <= q_pos[:, None] - window
    scores = np.where(mask, -np.inf, scores)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)) @ v


def linear_attention(model: ToyModel, x: np.ndarray, conv_state: np.ndarray,
                     state: np.ndarray):
    """Runs x ([n, 3·dim]: q, k, v) through the convolution and the recurrence, starting from
    conv_state ([CONV - 1, 3·dim], the inputs before x) and state ([dim, dim]); returns the
    outputs and the states after the last token."""
    d = model.dim
    history = np.concatenate([conv_state, x])
    out = np.empty((len(x), d))
    for t in range(len(x)):
        y = (model.conv * history[t:t + CONV]).sum(axis=0)
        q, k, v = y[:d], y[d:2 * d] / np.sqrt(d), y[2 * d:]
        state = f32(DECAY * state + np.outer(k, v))
        out[t] = q @ state
    return out, history[len(x):], state


def dense_generate(model: ToyModel, prompt: List[int], max_new_tokens: int) -> List[int]:
    """The request alone, recomputing everything each token."""
    tokens = list(prompt)
    d = model.dim
    for _ in range(max_new_tokens):
        pos = np.arange(len(tokens))

        def mixer(layer, q, k, v):
            if KINDS[layer] == "linear_attention":
                zeros = np.zeros((CONV - 1, 3 * d)), np.zeros((d, d))
                return linear_attention(model, np.concatenate([q, k, v], axis=1), *zeros)[0]
            window = WINDOW if KINDS[layer] == "sliding_attention" else 0
            return attention(q, k, v, pos, pos, window)

        h = model.forward(np.array(tokens), pos, mixer)
        tokens.append(model.next_token(h[-1]))
    return tokens[len(prompt):]


class HostCache:
    """The scheduler's host-backing views of every layer: K and V [blocks, block_size, 1, dim]
    of the attention layers, conv [slots, CONV - 1, 3·dim] and recurrent [slots, 1, dim, dim]
    states of the linear one, and each layer's group."""

    def __init__(self, s: kvpage.Scheduler):
        self.group = {t["layer"]: t["group"] for t in s.cache_tensors}
        self.views = {(t["layer"], t["part"]): s.cache(t["layer"], t["part"])
                      for t in s.cache_tensors}

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        key, value = self.views[layer, "key"], self.views[layer, "value"]
        block = key.shape[1]
        key[slots // block, slots % block, 0] = k
        value[slots // block, slots % block, 0] = v

    def read(self, layer: int, slots: np.ndarray):
        key, value = self.views[layer, "key"], self.views[layer, "value"]
        block = key.shape[1]
        return key[slots // block, slots % block, 0], value[slots // block, slots % block, 0]

    def states(self, layer: int):
        return self.views[layer, "conv_state"], self.views[layer, "recurrent_state"]

    def state_slots(self, read: int, write: int):
        """Where a step reads a request's state (its own, or a prefix-cache snapshot) and
        where it leaves it."""
        return read, write

    def zero(self, group: int, slot: int) -> None:
        """Clears a state slot in every linear-attention layer of the group."""
        for layer in (l for l, g in self.group.items() if g == group):
            for view in self.states(layer):
                view[slot] = 0


def serve_step(model: ToyModel, cache: HostCache, out: kvpage.StepOutput,
               history: Dict[int, List[int]]) -> np.ndarray:
    """Runs one scheduled batch; returns one sampled token per sampling request."""
    groups = [g["group"] for g in out.attention_groups]
    tables, slot_mappings = out.block_tables, out.slot_mappings
    states = {g: (r, w) for g, r, w in zip(out.state_groups, out.read_slots, out.write_slots)}
    for group, slot in out.slots_to_zero:  # state slots new to a request start from zeros
        cache.zero(group, slot)
    sampled = []
    first = 0
    for rid, row, start, count, samples in zip(out.request_ids, out.rows,
                                               out.num_computed_tokens,
                                               out.num_scheduled_tokens, out.samples):
        pos = np.arange(start, start + count)
        tokens = np.array(history[int(rid)])[pos]

        def mixer(layer, q, k, v):
            group = cache.group[layer]
            if KINDS[layer] == "linear_attention":
                read, write = cache.state_slots(*(slots[row] for slots in states[group]))
                conv, recurrent = cache.states(layer)
                y, conv_after, state_after = linear_attention(
                    model, np.concatenate([q, k, v], axis=1), conv[read], recurrent[read, 0])
                conv[write], recurrent[write, 0] = conv_after, state_after
                return y
            i = groups.index(group)
            window = WINDOW if KINDS[layer] == "sliding_attention" else 0
            cache.write(layer, slot_mappings[i][first:first + count], k, v)
            # Slots of the positions this step's queries read: the window's, or all.
            k_pos = np.arange(max(0, start - window + 1) if window else 0, start + count)
            block = out.attention_groups[i]["kernel_block_size"]
            slots = tables[i][row, k_pos // block] * block + k_pos % block
            return attention(q, *cache.read(layer, slots), pos, k_pos, window)

        h = model.forward(tokens, pos, mixer)
        first += count
        if samples:
            sampled.append(model.next_token(h[-1]))
    return np.array(sampled, dtype=np.int32)


def run(num_requests: int = 12, kv_budget_bytes: int = 320 << 10, seed: int = 0,
        cache_type: type = HostCache) -> Dict[str, int]:
    """Serves the requests; returns {"equal": 0 or 1, "preemptions": n, "cached_tokens": n}."""
    model = ToyModel(seed=seed)
    rng = np.random.default_rng(seed)
    shared = [rng.integers(0, model.vocab, size=40).tolist() for _ in range(3)]
    prompts, lengths = [], []
    for i in range(num_requests):
        tail = rng.integers(0, model.vocab, size=int(rng.integers(1, 30))).tolist()
        prompts.append(shared[i % 3] + tail)
        lengths.append(int(rng.integers(1, 48)))

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(model.config(), f)
        spec = kvpage.load_model(path)
    # 64 KiB chunks of 4 KiB pages: a small budget is a few chunks per pool, so it preempts.
    s = kvpage.Scheduler(spec, kv_budget_bytes=kv_budget_bytes, max_num_batched_tokens=64,
                         hash_seed=seed, chunk_bytes=64 << 10, backing="host")
    history: Dict[int, List[int]] = {}
    for prompt, n in zip(prompts, lengths):
        history[s.add_request(prompt, max_new_tokens=n).id] = list(prompt)
    cache = cache_type(s)
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
    parser.add_argument("--kv-budget-kib", type=int, default=320)
    args = parser.parse_args()
    raise SystemExit(0 if run(args.requests, args.kv_budget_kib << 10)["equal"] else 1)
