"""absl::Status codes become Python exceptions carrying kvpage's message."""

import pytest

import kvpage


def test_unknown_model_is_key_error():
    with pytest.raises(KeyError, match="no-such-model"):
        kvpage.load_model("no-such-model")


def test_malformed_config_is_value_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "num_hidden_layers": -3}')
    with pytest.raises(ValueError, match="config.json"):
        kvpage.load_model(str(path))


def test_unknown_gpu_is_key_error():
    with pytest.raises(KeyError, match="no-such-gpu"):
        kvpage.plan("qwen3-8b", contexts=[4096], gpu="no-such-gpu")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"block_size": 0}, "block_size must be in \\[1, 2\\^30\\], got 0"),
        ({"policy": "sglang"}, "sglang"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
        ({"contexts": [0]}, "context"),
        ({"tp": 0}, "tp must be in \\[1, 1024\\], got 0"),
        ({"kv_budget_gib": -1.0}, "kv_budget_gib must be in \\(0, 1e9\\], got -1"),
        ({"gpu_memory_utilization": 0.5}, "gpu_memory_utilization needs gpu"),
    ],
)
def test_bad_plan_argument_is_value_error_naming_it(kwargs, message):
    kwargs = dict(kwargs)
    contexts = kwargs.pop("contexts", [4096])
    with pytest.raises(ValueError, match=message):
        kvpage.plan("qwen3-8b", contexts=contexts, **kwargs)


def test_unknown_keyword_is_type_error():
    with pytest.raises(TypeError):
        kvpage.plan("qwen3-8b", contexts=[4096], blok_size=16)


def test_bad_simulate_argument_is_value_error():
    with pytest.raises(ValueError, match="max_num_seqs"):
        kvpage.simulate("qwen3-8b", gpu="h100", synthetic=4, request_rate=1.0, max_num_seqs=0)


def test_missing_trace_is_an_error():
    with pytest.raises((ValueError, KeyError, RuntimeError), match="no_such_trace"):
        kvpage.simulate("qwen3-8b", gpu="h100", trace="no_such_trace.jsonl")


def test_request_that_never_fits_is_memory_error():
    # A 1 MiB budget cannot hold one block of every layer of Qwen3-8B's 60 K-token prompt.
    with pytest.raises((MemoryError, ValueError)):
        kvpage.simulate("qwen3-8b", gpu="h100", synthetic=1, request_rate=1.0,
                        prompt_len=60000, kv_budget_gib=1 / 1024)
