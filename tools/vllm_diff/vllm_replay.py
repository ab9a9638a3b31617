#!/usr/bin/env python3
"""Drive vLLM's own KVCacheManager on CPU through an allocator workload and record an op log.

Every operation is written with vLLM's answer ("expect"), so that kvpage_vllm_replay can
replay the same log through kvpage's vllm-mode KvCacheManager and report the first op whose
answer differs. The manager is built the way vLLM's unit tests build it
(tests/v1/core/test_prefix_caching.py: a KVCacheConfig of KVCacheGroupSpecs with one-head,
one-dimension specs, no tensors, and KVCacheManager(config, max_model_len, ...)), with the
groups, block sizes and windows kvpage's vllm layout gives the model
(`kvpage_vllm_replay layout`).

Workload (deterministic): requests from a Mooncake trace (each hash id stands for 512
tokens), admitted one per round with a prefix lookup, prefilled in chunks of --chunk tokens,
then every live request decodes one token per round up to --max-output tokens. Trace
requests longer than max_model_len are skipped, as a server refuses them. When an
allocation fails, the oldest other live request is freed (eviction pressure); a request that
cannot fit on its own is dropped.

Usage: vllm_replay.py --layout layout.json --trace FILE --num-requests 300 --num-blocks N
       --out ops.jsonl
"""
import argparse
import collections
import json
from math import lcm

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

VOCAB = 50000
TOKENS_PER_HASH_ID = 512  # Mooncake's hash block


def make_spec(group):
    kind, bs = group["kind"], group["block_size"]
    common = dict(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    if kind == "full_attention":
        return FullAttentionSpec(**common)
    if kind == "mla":
        return MLAAttentionSpec(**common)
    if kind == "sliding_window":
        return SlidingWindowSpec(**common, sliding_window=group["window"])
    if kind == "linear_attention":
        return MambaSpec(block_size=bs, shapes=((1,),), dtypes=(torch.float32,),
                         mamba_cache_mode="align")
    raise ValueError(f"unknown group kind {kind}")


def make_kv_cache_config(layout, num_blocks):
    """One group per kvpage group, one-head specs, no tensors."""
    groups = []
    for i, g in enumerate(layout["groups"]):
        g = dict(g)
        if g["block_size"] == 0:
            g["block_size"] = layout["block_size"]  # align mode: a state block per `bs` tokens
        groups.append(KVCacheGroupSpec([f"layer{i}"], make_spec(g)))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
                "uint8": torch.uint8}


def make_grouped_kv_cache_config(layout, num_blocks):
    """The KV cache config vLLM itself derives from a model's per-layer specs.

    For DeepSeek-V3.2 the layout lists each MLA layer's latent and its indexer cache layer
    (DeepseekV32IndexerCache: an MLAAttentionSpec of 132 uint8 a token, cache_role INDEXER), as
    vllm/model_executor/models/deepseek_v2.py registers them. vLLM's own grouping
    (kv_cache_planning.get_kv_cache_groups) and placement decide the groups and the bytes of a
    block id; both must be what kvpage's layout says.
    """
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.v1.core import kv_cache_planning
    from vllm.v1.kv_cache_interface import SparseCacheRole

    bs = layout["block_size"]
    specs = {}
    for s in layout["vllm_layer_specs"]:
        indexer = s["name"].endswith(".indexer.k_cache")
        specs[s["name"]] = MLAAttentionSpec(
            block_size=bs, num_kv_heads=1, max_tp_shards=1, head_size=s["head_size"],
            dtype=TORCH_DTYPES[s["dtype"]],
            cache_role=SparseCacheRole.INDEXER if indexer else SparseCacheRole.SPARSE,
            is_index_group_leader=not indexer)
    vllm_config = VllmConfig(device_config=DeviceConfig(device="cpu"))  # no model: no GPU
    vllm_config.cache_config.kv_cache_layout = "LBNHC"  # set by the engine core otherwise
    groups = kv_cache_planning.get_kv_cache_groups(vllm_config, specs)
    if len(groups) != len(layout["groups"]):
        raise SystemExit(f"vLLM makes {len(groups)} groups of the layer specs, kvpage "
                         f"{len(layout['groups'])}")
    block_bytes = kv_cache_planning._pool_bytes_per_block(vllm_config, groups)
    if block_bytes != layout["block_id_bytes"]:
        raise SystemExit(f"vLLM's block id costs {block_bytes} bytes, kvpage's "
                         f"{layout['block_id_bytes']}")
    config = kv_cache_planning.get_kv_cache_config_from_groups(vllm_config, groups,
                                                               num_blocks * block_bytes)
    if config.num_blocks != num_blocks:
        raise SystemExit(f"vLLM sizes {config.num_blocks} blocks, asked for {num_blocks}")
    # The engine core hands its scheduler one member spec per group (vllm/v1/engine/core.py).
    return generate_scheduler_kv_cache_config([config])


def make_manager(layout, num_blocks):
    bs = layout["block_size"]
    if layout.get("vllm_layer_specs"):
        config = make_grouped_kv_cache_config(layout, num_blocks)
    else:
        config = make_kv_cache_config(layout, num_blocks)
    groups = config.kv_cache_groups
    return KVCacheManager(
        config,
        max_model_len=layout["max_model_len"],
        scheduler_block_size=lcm(*(g.kv_cache_spec.block_size for g in groups)),
        hash_block_size=bs,
        enable_caching=True,
    )


def make_request(rid, tokens, bs):
    params = SamplingParams(max_tokens=1 << 20)
    params.update_from_generation_config({}, eos_token_id=VOCAB + 1)
    return Request(request_id=rid, prompt_token_ids=tokens, sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(bs, sha256))


def prompt_tokens(entry, shared_prefix_tokens=0, index=0):
    # Optionally one of four shared documents first, so that long prefixes repeat.
    tokens = [(index % 4) * 7 + 60000 + j % 977 for j in range(shared_prefix_tokens)]
    for h in entry["hash_ids"]:
        tokens.extend((h * 1000003 + j * 7919) % VOCAB + 1 for j in range(TOKENS_PER_HASH_ID))
    return tokens[: shared_prefix_tokens + entry["input_length"]]


class Recorder:
    def __init__(self, manager, layout, out):
        self.m, self.layout, self.out = manager, layout, out
        self.ops = 0

    def write(self, op):
        self.out.write(json.dumps(op, separators=(",", ":")) + "\n")
        self.ops += 1

    def is_state(self, g):
        return self.layout["groups"][g]["block_size"] == 0

    def tables(self, req):
        out = []
        for g, mgr in enumerate(self.m.coordinator.single_type_managers):
            ids = [b.block_id for b in mgr.req_to_blocks.get(req.request_id, [])]
            out.append(sorted(i for i in ids if i != 0) if self.is_state(g) else ids)
        return out

    def free_order(self):
        return [b.block_id for b in self.m.block_pool.free_block_queue.get_all_free_blocks()]

    def step(self):
        self.m.new_step_starts()
        self.write({"op": "step"})

    def add(self, req):
        self.write({"op": "add", "req": req.request_id, "tokens": list(req.prompt_token_ids)})

    def hit(self, req):
        blocks, tokens, _ = self.m.get_computed_blocks(req)
        ids = []
        for g, group in enumerate(blocks.get_block_ids()):
            group = list(group)
            if self.is_state(g):
                group = [group[-1]] if group and group[-1] != 0 else []
            ids.append(group)
        self.write({"op": "hit", "req": req.request_id,
                    "expect": {"tokens": tokens, "blocks": ids}})
        return blocks, tokens

    def alloc(self, req, new, hit=None):
        computed = req.num_computed_tokens
        if hit is not None:
            blocks, hit_tokens = hit
            got = self.m.allocate_slots(req, new, hit_tokens, blocks)
            computed += hit_tokens
        else:
            got = self.m.allocate_slots(req, new)
        expect = {"ok": got is not None, "free": self.m.block_pool.get_num_free_blocks()}
        if got is not None:
            expect["tables"] = self.tables(req)
        self.write({"op": "alloc", "req": req.request_id, "computed": computed, "new": new,
                    "use_hit": hit is not None, "expect": expect})
        if got is not None:
            req.num_computed_tokens = computed + new
        return got is not None

    def append(self, req, token):
        req.append_output_token_ids(token)
        self.write({"op": "append", "req": req.request_id, "token": token})

    def free(self, req):
        self.m.free(req)
        self.write({"op": "free", "req": req.request_id,
                    "expect": {"free_order": self.free_order()}})


def run(rec, entries, args, bs):
    live = collections.OrderedDict()  # request id -> (request, outputs left)
    stats = collections.Counter()

    def evict_oldest(keep):
        for rid in live:
            if rid != keep:
                rec.free(live.pop(rid)[0])
                stats["evicted"] += 1
                return True
        return False

    def alloc_or_evict(req, new, hit=None):
        while True:
            if rec.alloc(req, new, hit):
                return True
            if not evict_oldest(req.request_id):
                return False

    # vLLM's scheduler ends prefill chunks on block boundaries for linear attention
    # (Scheduler._mamba_block_aligned_split), so those models prefill one block at a time.
    has_state = any(g["block_size"] == 0 for g in rec.layout["groups"])
    chunk = bs if has_state else args.chunk
    for i, entry in enumerate(entries):
        while len(live) >= args.max_live:
            evict_oldest(None)
        rec.step()
        req = make_request(f"r{i}", prompt_tokens(entry, args.shared_prefix_tokens, i), bs)
        rec.add(req)
        hit = rec.hit(req)
        stats["hit_tokens"] += hit[1]
        ok = True
        first = True
        while ok and req.num_computed_tokens < req.num_prompt_tokens:
            if not first:
                rec.step()
            done = req.num_computed_tokens + (hit[1] if first else 0)
            new = min(chunk, req.num_prompt_tokens - done)
            ok = alloc_or_evict(req, new, hit if first else None)
            first = False
        if not ok:
            rec.free(req)
            stats["dropped"] += 1
            continue
        live[req.request_id] = (req, min(entry["output_length"], args.max_output))
        # One decode round: every live request samples a token, then computes it.
        rec.step()
        for rid in list(live):
            if rid not in live:
                continue
            r, left = live[rid]
            rec.append(r, (i * 31 + r.num_tokens) % VOCAB + 1)
            if left <= 1:
                rec.free(live.pop(rid)[0])
                continue
            if not alloc_or_evict(r, 1):
                rec.free(live.pop(rid)[0])
                stats["dropped"] += 1
                continue
            live[rid] = (r, left - 1)
    for rid in list(live):
        rec.free(live.pop(rid)[0])
    return stats


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layout", required=True)
    p.add_argument("--trace", required=True)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--num-blocks", type=int, required=True, help="vLLM num_gpu_blocks")
    p.add_argument("--chunk", type=int, default=512,
                   help="prefill chunk (models with linear attention: one block)")
    p.add_argument("--max-output", type=int, default=32)
    p.add_argument("--max-live", type=int, default=1 << 30,
                   help="free the oldest live request before admitting beyond this many")
    p.add_argument("--shared-prefix-tokens", type=int, default=0,
                   help="start every prompt with one of four shared documents this long")
    p.add_argument("--vllm-version", default="0.33")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    init_none_hash(sha256)
    with open(args.layout) as f:
        layout = json.load(f)
    # The first --num-requests trace requests that fit max_model_len with their outputs (a
    # server refuses the others before they reach the KV cache).
    entries, too_long = [], 0
    with open(args.trace) as f:
        for line in f:
            entry = json.loads(line)
            length = args.shared_prefix_tokens + entry["input_length"]
            if length + args.max_output > layout["max_model_len"]:
                too_long += 1
                continue
            entries.append(entry)
            if len(entries) == args.num_requests:
                break
    manager = make_manager(layout, args.num_blocks)
    with open(args.out, "w") as out:
        header = {"model": layout["model"], "num_blocks": args.num_blocks,
                  "vllm_version": args.vllm_version,
                  "max_model_len": layout["max_model_len"]}
        out.write(json.dumps(header) + "\n")
        rec = Recorder(manager, layout, out)
        stats = run(rec, entries, args, layout["block_size"])
    print(json.dumps({"requests": len(entries), "skipped_too_long": too_long, "ops": rec.ops,
                      **stats}))


if __name__ == "__main__":
    main()
