"""examples/python/: the toy decoder's tokens through kvpage.Scheduler equal its dense run."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples", "python"))

import toy_decoder  # noqa: E402


@pytest.mark.parametrize("budget_kib,preemptions,cached", [(320, 6, 256), (448, 2, 160)])
def test_toy_decoder_tokens_equal_dense_run(budget_kib, preemptions, cached):
    # The toy's blocks are 4 KiB (16 tokens x K and V x 32 float32 values) in each attention
    # pool and its state slots 5,248 bytes (conv 3 x 96 + recurrent 32 x 32 float32 values),
    # in 64 KiB chunks: 320 KiB is 4 chunks besides the null blocks, so the 12 requests
    # (41 to 69 prompt tokens, up to 47 new) preempt each other and resume; both budgets
    # serve shared prompt prefixes from the prefix cache (the linear layer from kvpage's state
    # snapshots). The counts are the scheduler's, deterministic for seed 0.
    stats = toy_decoder.run(num_requests=12, kv_budget_bytes=budget_kib << 10)
    assert stats == {"equal": 1, "preemptions": preemptions, "cached_tokens": cached}


class OffByOneCache(toy_decoder.HostCache):
    """Writes every token's K and V one slot past where the slot mapping says."""

    def write(self, layer, slots, k, v):
        key = self.views[layer, "key"]
        super().write(layer, (slots + 1) % (key.shape[0] * key.shape[1]), k, v)


class WriteSlotStateCache(toy_decoder.HostCache):
    """Reads a request's linear-attention state from its write slot, not its read slot (they
    differ when a step starts from a prefix-cache snapshot or leaves one behind)."""

    def state_slots(self, read, write):
        return write, write


@pytest.mark.parametrize("cache_type", [OffByOneCache, WriteSlotStateCache])
def test_toy_decoder_notices_misplaced_kv_and_stale_state(cache_type):
    # The comparison can fail: with K/V one slot off, or a linear-attention state read from the
    # wrong slot, the tokens differ from the dense run.
    stats = toy_decoder.run(num_requests=12, cache_type=cache_type)
    assert stats["equal"] == 0


def test_plan_and_sweep_functions():
    import plan_and_sweep

    import kvpage

    model = kvpage.load_model("gemma-3-4b-it")
    plans = plan_and_sweep.plan_sweep(model, [4096, 32768])
    assert list(plans) == ["kvpage", "vllm", "llamacpp"]
    assert plans["kvpage"][1] == 792723456 / 2**30  # as test_plan's done-when line
    points = plan_and_sweep.rate_sweep(model, "h100", [2.0, 8.0], requests=20)
    assert [p["rate"] for p in points] == [2.0, 8.0]
    assert points[0]["output_throughput"] < points[1]["output_throughput"]
