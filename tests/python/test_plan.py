"""kvpage.load_model and kvpage.plan against `kvpage plan --format json`."""

import os
import shutil

import pytest

import kvpage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_load_model_bundled():
    m = kvpage.load_model("gemma-3-4b-it")
    assert m.name == "gemma-3-4b-it"
    assert m.source == "bundled:gemma-3-4b-it"
    assert m.cli_name == "gemma-3-4b-it"
    assert m.num_layers == 34
    assert [g["kind"] for g in m.groups] == ["sliding_window", "full_attention"]
    assert sum(len(g["layers"]) for g in m.groups) == 34
    assert "gemma-3-4b-it" in kvpage.bundled_models()
    assert "h100" in kvpage.bundled_gpus()


def test_load_model_path(tmp_path):
    src = os.path.join(REPO, "sim", "data", "models", "gemma-3-4b-it.json")
    dst = tmp_path / "config.json"
    shutil.copy(src, dst)
    from_path = kvpage.load_model(str(dst))
    assert from_path.source == str(dst)
    assert from_path.cli_name == str(dst)
    assert from_path.num_layers == 34
    bundled = kvpage.plan("gemma-3-4b-it", contexts=[32768]).rows[0].reserved_bytes
    assert kvpage.plan(from_path, contexts=[32768]).rows[0].reserved_bytes == bundled


def test_done_when_line(cli):
    # The line: the same number as `kvpage plan --format json`.
    got = kvpage.plan(kvpage.load_model("gemma-3-4b-it"), contexts=[32768]).rows[0].reserved_bytes
    want = cli("plan", "--model", "gemma-3-4b-it", "--context", "32768", "--format", "json")
    assert got == want["rows"][0]["reserved_bytes"]
    assert got == GEMMA_32K_KVPAGE_BYTES


# `kvpage plan --model gemma-3-4b-it --context 32768 --format json`: rows[0].reserved_bytes.
GEMMA_32K_KVPAGE_BYTES = 792723456


CASES = [
    ("gemma-3-4b-it", [32768], {}, []),
    ("qwen3.5-9b", [4096, 32768], {"policy": "vllm", "gpu": "h100"},
     ["--policy", "vllm", "--gpu", "h100"]),
    ("gpt-oss-20b", ["4K", "128K"], {"policy": "llamacpp", "parallel": 4, "kv_unified": True},
     ["--policy", "llamacpp", "--parallel", "4", "--kv-unified"]),
    ("llama-3.1-8b", [131072], {"tp": 2, "gpu": "h100", "gpu_memory_utilization": 0.8},
     ["--tp", "2", "--gpu", "h100", "--gpu-memory-utilization", "0.8"]),
    ("qwen3-8b", [8192], {"block_size": 32, "enable_prefix_caching": False,
                          "kv_cache_dtype": "fp8", "kv_budget_gib": 20.5},
     ["--block-size", "32", "--no-enable-prefix-caching", "--kv-cache-dtype", "fp8",
      "--kv-budget-gib", "20.5"]),
    ("deepseek-v2-lite", [1024], {"policy": "vllm", "async_scheduling": False,
                                  "vllm_version": "0.29"},
     ["--policy", "vllm", "--no-async-scheduling", "--vllm-version", "0.29"]),
    ("llama-3.1-8b", [32768], {"policy": "vllm", "gpu": "h100", "max_num_seqs": 256,
                               "enforce_eager": True},
     ["--policy", "vllm", "--gpu", "h100", "--max-num-seqs", "256", "--enforce-eager"]),
]


@pytest.mark.parametrize("model,contexts,kwargs,flags", CASES)
def test_plan_equals_cli_json(cli, model, contexts, kwargs, flags):
    p = kvpage.plan(kvpage.load_model(model), contexts=contexts, **kwargs)
    want = cli("plan", "--model", model, "--context", ",".join(map(str, contexts)),
               "--format", "json", *flags)
    assert p.to_dict() == want
    assert len(p.rows) == len(contexts)


def test_plan_vllm_runtime_memory():
    # llama-3.1-8b at 8,192 tokens and 1,024 requests (tests/planner/vllm_runtime_memory_test.cc).
    p = kvpage.plan("llama-3.1-8b", contexts=[32768], policy="vllm", gpu="h100")
    assert p.vllm_runtime == {"activation_bytes": 2006450176, "cuda_graph_bytes": 969051997,
                              "non_torch_bytes": 268435456}
    assert p.kv_budget_bytes == 57664268860
    assert kvpage.plan("llama-3.1-8b", contexts=[32768], gpu="h100").vllm_runtime is None


def test_plan_result_is_frozen():
    p = kvpage.plan("qwen3-8b", contexts=[4096], kv_budget_gib=10)
    row = p.rows[0]
    assert row.context == 4096
    assert row.reserved_bytes == row.kv_bytes + row.state_bytes
    assert row.max_concurrency == (10 << 30) // row.reserved_bytes
    with pytest.raises(AttributeError):
        row.reserved_bytes = 0
    assert p.tp == 1 and p.policy == "kvpage" and p.kv_budget_bytes == 10 << 30


def test_plan_to_pandas():
    pd = pytest.importorskip("pandas")
    p = kvpage.plan("qwen3-8b", contexts=[4096, 32768])
    df = p.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert list(df["context"]) == [4096, 32768]
    assert list(df["reserved_bytes"]) == [r.reserved_bytes for r in p.rows]


def test_plan_default_contexts_are_the_clis(cli):
    assert kvpage.plan("qwen3-8b").to_dict() == cli("plan", "--model", "qwen3-8b",
                                                    "--format", "json")
