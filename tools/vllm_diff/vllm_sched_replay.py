#!/usr/bin/env python3
"""Run vLLM's own Scheduler on CPU over trace requests and record every step.

The scheduler is built as vLLM's tests/v1/core/utils.py create_scheduler builds it (a
SchedulerConfig, a ModelConfig, a CacheConfig, a KVCacheConfig of one-head specs and no
tensors), with kvpage's vllm layout of the model for the KV cache groups (from
`kvpage_vllm_replay layout`). The ModelConfig reads a local config.json (no network) and the
device is the CPU. Every request arrives at step 0; each step's record holds what vLLM
scheduled (tokens per request), whom it preempted, and the token each sampling request got,
so that `kvpage_vllm_replay sched --log FILE` can feed kvpage's Scheduler the same tokens
and compare its steps. With --async it builds vLLM's AsyncScheduler and schedules each step
before applying the previous one's output, as vLLM's engine does with two batches in flight.
"""
import argparse
import json
import os
import tempfile

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

import vllm_replay

VOCAB = vllm_replay.VOCAB


def model_dir(config_json):
    """A directory holding the bundled config.json without kvpage's _source note."""
    with open(config_json) as f:
        config = json.load(f)
    config.pop("_source", None)
    path = tempfile.mkdtemp(prefix="vllm_diff_model_")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def make_scheduler(args, layout):
    bs = layout["block_size"]
    scheduler_config = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=layout["max_model_len"],
        enable_chunked_prefill=True,
        async_scheduling=args.async_scheduling,
        is_encoder_decoder=False,
    )
    model_config = ModelConfig(model=model_dir(args.model_config), trust_remote_code=True,
                               dtype="bfloat16", seed=42, skip_tokenizer_init=True,
                               max_model_len=layout["max_model_len"])
    # A model with linear attention (Mamba / Gated DeltaNet) runs in align mode, as vLLM sets it
    # for such a model when prefix caching is on (MambaModelConfig): a state block per `bs`
    # tokens, and the scheduler ends prompt chunks on block boundaries.
    hybrid = any(g["kind"] == "linear_attention" for g in layout["groups"])
    cache_config = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=True,
                               mamba_cache_mode="align" if hybrid else "none",
                               mamba_block_size=bs if hybrid else None)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    kv_cache_config = vllm_replay.make_kv_cache_config(layout, args.num_blocks)
    cache_config.num_gpu_blocks = args.num_blocks
    cls = AsyncScheduler if args.async_scheduling else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=True,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=bs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layout", required=True)
    # The KV cache groups come from --layout. The scheduler reads only max_model_len and the
    # model's modalities from the ModelConfig, so a text-only config serves every model (Gemma
    # 3's own is multimodal and would need a tokenizer).
    p.add_argument("--model-config", required=True, help="a text-only model's config.json")
    p.add_argument("--trace", required=True)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--num-blocks", type=int, required=True)
    p.add_argument("--max-num-batched-tokens", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--vllm-version", default="0.33")
    p.add_argument("--async", dest="async_scheduling", action="store_true",
                   help="vLLM's AsyncScheduler: step N + 1 is scheduled before step N's update")
    p.add_argument("--free-order-steps", type=lambda v: {int(x) for x in v.split(",") if x},
                   default=set(), help="steps whose whole free queue the log keeps")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    init_none_hash(sha256)
    with open(args.layout) as f:
        layout = json.load(f)
    bs = layout["block_size"]
    sched = make_scheduler(args, layout)
    entries = []
    with open(args.trace) as f:
        for line in f:
            entry = json.loads(line)
            if entry["input_length"] + args.max_output <= layout["max_model_len"]:
                entries.append(entry)
            if len(entries) == args.num_requests:
                break
    out = open(args.out, "w")
    out.write(json.dumps({"model": layout["model"], "num_blocks": args.num_blocks,
                          "vllm_version": args.vllm_version,
                          "max_model_len": layout["max_model_len"],
                          "max_num_batched_tokens": args.max_num_batched_tokens,
                          "max_num_seqs": args.max_num_seqs,
                          "async_scheduling": args.async_scheduling}) + "\n")
    requests = {}
    for i, entry in enumerate(entries):
        params = SamplingParams(max_tokens=min(entry["output_length"], args.max_output),
                                ignore_eos=True)
        tokens = vllm_replay.prompt_tokens(entry)
        req = Request(request_id=f"r{i}", prompt_token_ids=tokens, sampling_params=params,
                      pooling_params=None, block_hasher=get_request_block_hasher(bs, sha256))
        requests[req.request_id] = req
        sched.add_request(req)
        out.write(json.dumps({"op": "add", "req": req.request_id, "tokens": tokens,
                              "max_tokens": params.max_tokens}, separators=(",", ":")) + "\n")
    steps = preemptions = 0
    in_flight = None  # async: the step scheduled before, not updated yet
    while sched.has_unfinished_requests():
        so = sched.schedule()
        scheduled = dict(so.num_scheduled_tokens)
        sampled = {}
        for rid in scheduled:
            req = requests[rid]
            # schedule() has already advanced num_computed_tokens by the step's tokens (and,
            # async, counted the token a sampling step adds as an output placeholder).
            samples = (not req.is_prefill_chunk if args.async_scheduling
                       else req.num_computed_tokens >= req.num_tokens)
            if samples:
                sampled[rid] = (steps * 31 + req.num_tokens) % VOCAB + 1
        ids = list(scheduled)
        runner_out = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
            sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in ids])
        preempted = sorted(so.preempted_req_ids or [])
        pool = sched.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        # Where each scheduled request started (its prefix hit, for a new one), and the whole
        # free queue's order as a hash: both differ before any count does.
        computed = sorted([r, requests[r].num_computed_tokens - n] for r, n in scheduled.items())
        free_order = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        free_hash = 0
        for b in free_order:
            free_hash = (free_hash * 1000003 + b + 1) % (1 << 40)
        preemptions += len(preempted)
        if args.async_scheduling:
            if in_flight is not None:
                sched.update_from_output(*in_flight)
            in_flight = (so, runner_out)
        else:
            sched.update_from_output(so, runner_out)
        record = {"op": "sched",
                  "expect": {"scheduled": sorted([r, n] for r, n in scheduled.items()),
                             "computed": computed, "preempted": preempted, "free": free,
                             "free_hash": free_hash},
                  "sampled": sampled}
        if steps in args.free_order_steps:  # the whole queue, to see where it differs
            record["expect"]["free_order"] = free_order
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
        steps += 1
        if in_flight is not None and not sched.has_unfinished_requests():
            sched.update_from_output(*in_flight)  # the last step (requests left only there)
            in_flight = None
    out.close()
    print(json.dumps({"requests": len(entries), "steps": steps, "preemptions": preemptions}))


if __name__ == "__main__":
    main()
