"""kvpage.simulate_fleet and kvpage.plan_slo against the CLI's JSON, their errors, the GIL."""

import numpy as np
import pytest

import kvpage

TRACE = "mooncake_conversation_trace.jsonl"


def without_wall(d):
    d = dict(d)
    d.pop("wall_seconds")
    return d


def test_simulate_fleet_equals_cli_json(cli):
    r = kvpage.simulate_fleet(kvpage.load_model("qwen3-8b"), gpu="h100", replicas=3,
                              router="prefix-aware", overlap_weight=0.5, trace=TRACE,
                              max_requests=150)
    want = cli("sim", "--model", "qwen3-8b", "--gpu", "h100", "--replicas", "3",
               "--router", "prefix-aware", "--overlap-weight", "0.5", "--trace", TRACE,
               "--max-requests", "150", "--output-json", "-")
    assert without_wall(r.to_dict()) == without_wall(want)
    d = r.to_dict()
    assert (r.router, r.replicas, d["router"], d["replicas"]) == ("prefix-aware", 3,
                                                                 "prefix-aware", 3)
    # 10 of the first 150 Mooncake prompts exceed Qwen3-8B's 40,960 tokens and are dropped.
    assert (d["completed"], d["dropped_requests"]) == (140, 10)
    assert len(r.per_replica) == 3
    assert sum(p["completed"] for p in r.per_replica) == 140
    assert len(r.requests) == 140 and r.requests.index.dtype == np.int64
    assert np.all(np.diff(r.requests.index) > 0)
    assert r.summary["ttft_ms"]["p99"] == d["p99_ttft_ms"]


def test_simulate_fleet_takes_simulate_keywords_only():
    with pytest.raises(TypeError, match="policy"):
        kvpage.simulate_fleet("qwen3-8b", gpu="h100", replicas=2, policy="vllm")
    with pytest.raises(ValueError, match="router"):
        kvpage.simulate_fleet("qwen3-8b", gpu="h100", replicas=2, router="random",
                              synthetic=10)
    with pytest.raises(ValueError, match="replicas"):
        kvpage.simulate_fleet("qwen3-8b", gpu="h100", replicas=0, synthetic=10)
    with pytest.raises(KeyError, match="b300"):
        kvpage.simulate_fleet("qwen3-8b", gpu="b300", replicas=2, synthetic=10)


SLO_ARGS = {"gpu": "h100", "trace": TRACE, "max_requests": 100,
            "routers": ["round-robin", "least-loaded"], "jobs": 1}


def test_plan_slo_equals_cli_json(cli):
    p = kvpage.plan_slo("qwen3-8b", slo={"ttft-p99": "3s", "tpot-p99": "100ms"}, **SLO_ARGS)
    want = cli("plan", "--model", "qwen3-8b", "--gpu", "h100", "--trace", TRACE,
               "--slo", "ttft-p99=3s,tpot-p99=100ms", "--max-requests", "100",
               "--routers", "round-robin,least-loaded", "--jobs", "1", "--format", "json")
    assert p.to_dict() == want
    assert [(s["tp"], s["router"]) for s in p.searches] == [(1, "round-robin"),
                                                             (1, "least-loaded")]
    # The answer is the fewest GPUs any search found, and it met the SLO.
    fewest = min(s["gpus"] for s in p.searches if s["gpus"] is not None)
    assert p.answer["gpus"] == fewest
    assert p.answer["values_ms"]["ttft-p99"] <= 3000
    assert p.answer["values_ms"]["tpot-p99"] <= 100
    rows = p.probes()
    assert len(rows) == sum(len(s["probes"]) for s in p.searches)
    assert {r["router"] for r in rows} == {"round-robin", "least-loaded"}
    assert all({"tp", "replicas", "gpus", "met", "ttft-p99", "tpot-p99"} <= set(r) for r in rows)
    met = [r for r in rows if r["met"]]
    assert min(r["gpus"] for r in met) == fewest


def test_plan_slo_errors():
    with pytest.raises(ValueError, match="slo"):
        kvpage.plan_slo("qwen3-8b", slo="ttft-p42=3s", **SLO_ARGS)
    with pytest.raises(ValueError, match="routers"):
        kvpage.plan_slo("qwen3-8b", slo="ttft-p99=3s", **dict(SLO_ARGS, routers=["random"]))
    with pytest.raises(ValueError, match="max_requests"):
        kvpage.plan_slo("qwen3-8b", slo="ttft-p99=3s", **dict(SLO_ARGS, max_requests=0))
    with pytest.raises(KeyError, match="b300"):
        kvpage.plan_slo("qwen3-8b", slo="ttft-p99=3s", **dict(SLO_ARGS, gpu="b300"))


def test_plan_slo_releases_the_gil(assert_releases_gil):
    assert_releases_gil(
        lambda: kvpage.plan_slo("qwen3-8b", slo="ttft-p99=3s,tpot-p99=100ms", **SLO_ARGS))
