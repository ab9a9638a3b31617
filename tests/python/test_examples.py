"""examples/python/: the toy decoder's tokens through kvpage.Scheduler equal its dense run."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples", "python"))

import toy_decoder  # noqa: E402


@pytest.mark.parametrize("budget_mib,preemptions,cached", [(20, 2, 32), (40, 1, 256)])
def test_toy_decoder_tokens_equal_dense_run(budget_mib, preemptions, cached):
    # 20 MiB holds 8 of Qwen3-8B's 2.25 MiB blocks: requests are preempted and resume; both
    # budgets serve shared prompt prefixes from the prefix cache.
    stats = toy_decoder.run(num_requests=12, kv_budget_bytes=budget_mib << 20)
    assert stats == {"equal": 1, "preemptions": preemptions, "cached_tokens": cached}


class OffByOneCache(toy_decoder.PagedCache):
    """Writes every token's K and V one slot past where the slot mapping says."""

    def ensure(self, slots):
        super().ensure(slots + 1)

    def write(self, layer, slots, k, v):
        super().write(layer, slots + 1, k, v)


def test_toy_decoder_notices_misplaced_kv():
    # The comparison can fail: with K/V one slot off, the tokens differ from the dense run.
    stats = toy_decoder.run(num_requests=4, kv_budget_bytes=40 << 20, cache_type=OffByOneCache)
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
