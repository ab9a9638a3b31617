"""kvpage.simulate against `kvpage sim --output-json -`, its arrays, and the GIL release."""

import numpy as np
import pytest

import kvpage

TRACE = "mooncake_conversation_trace.jsonl"


def without_wall(d):
    d = dict(d)
    d.pop("wall_seconds")
    return d


@pytest.mark.parametrize(
    "model,kwargs,flags",
    [
        ("qwen3-8b", {"trace": TRACE, "max_requests": 200},
         ["--trace", TRACE, "--max-requests", "200"]),
        ("gemma-3-4b-it", {"synthetic": 100, "request_rate": 20.0, "prompt_len": 3000,
                           "shared_prefix_fraction": 0.5, "num_prefix_groups": 4,
                           "kv_budget_gib": 2.0, "allocator": "vllm", "seed": 7},
         ["--synthetic", "100", "--request-rate", "20", "--prompt-len", "3000",
          "--shared-prefix-fraction", "0.5", "--num-prefix-groups", "4",
          "--kv-budget-gib", "2", "--allocator", "vllm", "--seed", "7"]),
        ("qwen3.5-9b", {"trace": TRACE, "max_requests": 100, "enable_prefix_caching": False,
                        "max_num_seqs": 64, "tp": 2},
         ["--trace", TRACE, "--max-requests", "100", "--no-enable-prefix-caching",
          "--max-num-seqs", "64", "--tp", "2"]),
    ],
)
def test_simulate_equals_cli_json(cli, model, kwargs, flags):
    r = kvpage.simulate(kvpage.load_model(model), gpu="h100", **kwargs)
    want = cli("sim", "--model", model, "--gpu", "h100", "--output-json", "-", *flags)
    assert without_wall(r.to_dict()) == without_wall(want)
    assert r.allocator == kwargs.get("allocator", "kvpage")


def test_summary_groups_latencies_and_requests_are_arrays():
    r = kvpage.simulate("qwen3-8b", gpu="h100", trace=TRACE, max_requests=200)
    d = r.to_dict()
    s = r.summary
    assert s["ttft_ms"]["p99"] == d["p99_ttft_ms"]
    assert set(s["tpot_ms"]) == {"mean", "median", "std", "p90", "p99"}
    assert "p99_ttft_ms" not in s
    req = r.requests
    # 13 of the first 200 Mooncake prompts exceed Qwen3-8B's 40,960 tokens and are dropped.
    assert (d["completed"], d["dropped_requests"]) == (187, 13)
    assert len(req) == 187
    assert req.index.dtype == np.int64 and req.prompt_len.dtype == np.int32
    assert req.arrival_s.dtype == np.float64
    assert np.all(np.diff(req.index) > 0) and req.index[-1] == 199
    assert int(req.prompt_len.sum()) == d["total_input_tokens"]
    assert int(req.output_len.sum()) == d["total_output_tokens"]
    assert int(req.num_preemptions.sum()) == d["num_preemptions"]
    assert np.all(req.first_token_s >= req.arrival_s)
    assert np.all(req.finish_s >= req.first_token_s)
    assert np.median(req.ttft_s) * 1000 == pytest.approx(d["median_ttft_ms"])
    with pytest.raises(ValueError):
        req.prompt_len[0] = 1  # read-only


def test_requests_to_pandas():
    pd = pytest.importorskip("pandas")
    r = kvpage.simulate("qwen3-8b", gpu="h100", trace=TRACE, max_requests=20)
    df = r.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == len(r.requests) == r.to_dict()["completed"]
    assert list(df.columns) == list(kvpage.RequestRecords.__dataclass_fields__)


def test_simulate_releases_the_gil(assert_releases_gil):
    assert_releases_gil(
        lambda: kvpage.simulate("qwen3-8b", gpu="h100", trace=TRACE, max_requests=1000))
