"""Scheduler(backing="host"): the cache's tensors as NumPy and DLPack views, their lifetime,
and StepOutput.to_dlpack() / to_torch()."""

import gc
import json
import sys
import types

import numpy as np
import pytest

import kvpage

MIB = 1 << 20


def host(model, budget=64 * MIB, **kwargs):
    return kvpage.Scheduler(kvpage.load_model(model), kv_budget_bytes=budget, backing="host",
                            **kwargs)


@pytest.fixture
def toy(tmp_path):
    """A float32 model with one full, one sliding-window and one linear-attention layer."""
    config = {
        "torch_dtype": "float32", "num_hidden_layers": 3, "hidden_size": 32,
        "intermediate_size": 64, "num_attention_heads": 1, "num_key_value_heads": 1,
        "head_dim": 32, "vocab_size": 97, "max_position_embeddings": 4096,
        "layer_types": ["full_attention", "sliding_attention", "linear_attention"],
        "sliding_window": 8, "linear_conv_kernel_dim": 4, "linear_num_key_heads": 1,
        "linear_key_head_dim": 32, "linear_num_value_heads": 1, "linear_value_head_dim": 32,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return kvpage.Scheduler(kvpage.load_model(str(path)), kv_budget_bytes=320 << 10,
                            chunk_bytes=64 << 10, backing="host", enable_prefix_caching=False)


def address(a):
    return a.__array_interface__["data"][0]


def test_qwen3_8b_key_and_value_views():
    s = host("qwen3-8b")
    tensors = s.cache_tensors
    assert len(tensors) == 72  # 36 layers x (key, value)
    # A pool block is 36 layers x 16 tokens x (K, V) x 8 heads x 128 x 2 B = 2.25 MiB; 2 MiB
    # chunks round up to one block; the null block takes 2.25 MiB of the 64: 27 chunks, and
    # ids 0..27.
    assert tensors[0] == {"layer": 0, "group": 0, "part": "key", "dtype": "bf16",
                          "shape": (28, 16, 8, 128)}
    assert tensors[71] == {"layer": 35, "group": 0, "part": "value", "dtype": "bf16",
                           "shape": (28, 16, 8, 128)}
    k, v = s.cache(0, "key"), s.cache(0, "value")
    # NumPy has no bf16: the view holds the bits. One layer's block is 16 x 2 x 8 x 128 x 2 B
    # = 65,536 bytes, K's 16 token rows (2,048 B each) first, then V's.
    assert k.dtype == np.uint16 and k.shape == (28, 16, 8, 128)
    assert k.strides == (65536, 2048, 256, 2) and v.strides == k.strides
    assert address(v) - address(k) == 32768
    assert k.flags.writeable and not k.flags.owndata
    assert address(s.cache(1, "key")) != address(k)  # every layer has its own tensor


def test_mla_latent_and_linear_state_views():
    s = host("deepseek-v2-lite")
    # 27 MLA layers, one latent of kv_lora_rank 512 + rope 64 per token: a layer's block is
    # 16 x 576 x 2 B = 18,432 B, a pool block 27 x that = 497,664 B, so a 2 MiB chunk holds 4
    # blocks (1,990,656 B): (64 MiB - 497,664) / 1,990,656 = 33 chunks, ids 0..132.
    assert len(s.cache_tensors) == 27
    latent = s.cache(26, "latent")
    assert latent.shape == (133, 16, 1, 576) and latent.strides == (18432, 1152, 1152, 2)

    s = host("qwen3.5-0.8b")
    conv, state = s.cache(0, "conv_state"), s.cache(0, "recurrent_state")
    # Conv channels 2 x 16 x 128 + 16 x 128 = 6,144 over kernel 4 - 1 rows, bf16 bits; the
    # recurrent state 16 heads x 128 x 128 in float32 (mamba_ssm_dtype).
    assert conv.dtype == np.uint16 and conv.shape == (3, 3, 6144)
    assert conv.strides == (36864, 12288, 2)
    assert state.dtype == np.float32 and state.shape == (3, 16, 128, 128)
    assert [t["part"] for t in s.cache_tensors if t["layer"] == 3] == ["key", "value"]
    assert s.cache(3, "key").shape == (241, 16, 2, 256)


def test_fp8_cache_is_bytes():
    s = host("qwen3-8b", kv_cache_dtype="fp8")
    # fp8 halves the block to 1.125 MiB: still one block per 2 MiB chunk, 55 chunks.
    assert s.cache_tensors[0]["dtype"] == "fp8"
    assert s.cache(0).dtype == np.uint8 and s.cache(0).shape == (56, 16, 8, 128)


def test_views_alias_the_scheduler_memory(toy):
    k = toy.cache(0, "key")
    assert k.dtype == np.float32 and k.shape == (65, 16, 1, 32)
    assert k.sum() == 0.0  # never-mapped chunks read as zeros instead of faulting
    assert "array(" in repr(k)  # printing reads the last block, which no chunk maps yet
    toy.add_request(list(range(20)), max_new_tokens=1)
    out = toy.schedule()
    slots = np.array(out.slot_mappings[0])
    assert slots.tolist() == list(range(16, 36))  # blocks 1 and 2 of the full group
    k[slots // 16, slots % 16, 0] = 1.0
    again = toy.cache(0, "key")
    assert again[1].sum() == 16 * 32 and again[2].sum() == 4 * 32  # 20 tokens x 32 values
    exported = toy.cache(0, "key", framework="dlpack")
    assert exported.__dlpack_device__() == (1, 0)  # kDLCPU, device 0
    from_dlpack = np.from_dlpack(exported)
    assert from_dlpack.dtype == np.float32 and np.shares_memory(from_dlpack, k)
    from_dlpack[5, 0, 0, 0] = 2.5
    assert k[5, 0, 0, 0] == 2.5


def test_step_output_lists_state_slots_to_zero(toy):
    toy.add_request(list(range(20)), max_new_tokens=1)
    out = toy.schedule()
    # The toy's groups: 0 full, 1 sliding, 2 linear. The new request gets state slot 1 (the
    # first after the null slot), reads and writes it in place, and it must start zeroed.
    assert out.state_groups == [2]
    assert out.slots_to_zero == [(2, 1)]
    assert out.read_slots[0].tolist() == [1] and out.write_slots[0].tolist() == [1]
    assert [g["group"] for g in out.attention_groups] == [0, 1]


def test_release_idle_chunks_zeroes_the_released_memory():
    s = host("qwen3-8b")
    k = s.cache(0, "key")
    s.add_request(list(range(20)), max_new_tokens=1)
    out = s.schedule()
    slots = np.array(out.slot_mappings[0])
    k[slots // 16, slots % 16] = 0x3F80  # bf16 1.0
    assert np.count_nonzero(k) == 20 * 8 * 128
    s.update(out, np.array([7], dtype=np.int32))
    del out
    # The request finished; its 2 blocks (21 tokens) are one 2.25 MiB chunk each, which
    # stay mapped (and cached) until released: 2 x 2,359,296 bytes.
    assert np.count_nonzero(k) == 20 * 8 * 128
    assert s.release_idle_chunks() == 2 * 2359296
    assert np.count_nonzero(k) == 0
    assert s.release_idle_chunks() == 0


def test_cache_errors():
    s = host("qwen3-8b")
    with pytest.raises(ValueError, match="part must be key, value, latent, conv_state or "
                                         "recurrent_state, got 'keys'"):
        s.cache(0, "keys")
    with pytest.raises(ValueError, match=r"layer 36 is not a cache layer of this model "
                                         r"\(0 to 35\)"):
        s.cache(36)
    with pytest.raises(ValueError, match="layer -1 is not a cache layer"):
        s.cache(-1)
    with pytest.raises(KeyError, match="layer 0 has no latent tensor; its parts: key, value"):
        s.cache(0, "latent")
    with pytest.raises(ValueError, match="framework must be numpy, dlpack or torch, got 'jax'"):
        s.cache(0, framework="jax")
    plain = kvpage.Scheduler(kvpage.load_model("qwen3-8b"), kv_budget_bytes=64 * MIB)
    with pytest.raises(RuntimeError, match="has no memory backing: create it with "
                                           "backing='host'"):
        plain.cache(0)
    with pytest.raises(RuntimeError, match="has no memory backing"):
        plain.cache_tensors
    with pytest.raises(ValueError, match="backing must be None or 'host', got 'cuda'"):
        kvpage.Scheduler(kvpage.load_model("qwen3-8b"), kv_budget_bytes=MIB, backing="cuda")
    with pytest.raises(ValueError, match="map_unit_bytes.. is 3000, not a power of two"):
        host("qwen3-8b", backing_unit_bytes=3000)
    q8 = host("qwen3-8b", kv_cache_dtype="q8_0")
    with pytest.raises(RuntimeError, match="a q8_0 cache has no per-value view"):
        q8.cache(0)


def test_view_keeps_the_scheduler_alive():
    s = host("qwen3-8b")
    k = s.cache(0)
    k[1, 0, 0, 0] = 0x4000
    del s
    gc.collect()
    assert k[1, 0, 0, 0] == 0x4000  # the memory is still the scheduler's, which lives on
    k[1, 0, 0, 1] = 1
    assert k[1, 0, 0, :2].tolist() == [0x4000, 1]


def test_close_frees_the_memory_and_refuses_while_viewed(toy):
    k = toy.cache(0)
    with pytest.raises(RuntimeError, match=r"close\(\): 1 view\(s\) of the cache still "
                                           r"reference its memory"):
        toy.close()
    dl = toy.cache(2, "recurrent_state", framework="dlpack")
    del k
    with pytest.raises(RuntimeError, match=r"close\(\): 1 view\(s\)"):
        toy.close()
    del dl
    toy.add_request([1, 2, 3], max_new_tokens=1)
    out = toy.schedule()
    lens = out.seq_lens
    with pytest.raises(RuntimeError, match=r"close\(\): 1 array\(s\) of step 1"):
        toy.close()
    del lens
    toy.close()
    with pytest.raises(RuntimeError, match="this StepOutput's Scheduler is closed"):
        out.seq_lens
    for call in (lambda: toy.cache(0), lambda: toy.schedule(), lambda: toy.num_running,
                 lambda: toy.add_request([1]), lambda: toy.cache_tensors):
        with pytest.raises(RuntimeError, match="this Scheduler is closed"):
            call()
    toy.close()  # again: nothing to free


def test_step_to_dlpack_aliases_the_step_arrays(toy):
    toy.add_request(list(range(20)), max_new_tokens=1)
    out = toy.schedule()
    exported = out.to_dlpack()
    assert sorted(exported) == sorted([
        "request_ids", "num_computed_tokens", "rows", "num_scheduled_tokens", "samples",
        "query_start_loc", "seq_lens", "block_tables", "slot_mappings", "read_slots",
        "write_slots"])
    seq_lens = np.from_dlpack(exported["seq_lens"])
    assert seq_lens.tolist() == [20] and np.shares_memory(seq_lens, out.seq_lens)
    assert np.from_dlpack(exported["query_start_loc"]).tolist() == [0, 20]
    assert np.from_dlpack(exported["samples"]).tolist() == [True]
    tables = [np.from_dlpack(t) for t in exported["block_tables"]]
    assert [t[0, :3].tolist() for t in tables] == [[1, 2, 0], [1, 2, 0]]
    assert np.from_dlpack(exported["slot_mappings"][1]).tolist() == list(range(16, 36))
    assert np.from_dlpack(exported["read_slots"][0]).tolist() == [1]
    # The exports hold the step's buffers like its NumPy arrays do.
    with pytest.raises(RuntimeError, match=r"schedule\(\): \d+ array\(s\) of step 1"):
        toy.schedule()
    del exported, seq_lens, tables
    gc.collect()
    toy.update(out, np.array([4], dtype=np.int32))
    toy.schedule()


def test_to_torch_goes_through_torch_from_dlpack(toy, monkeypatch):
    # A stand-in torch whose from_dlpack is NumPy's: to_torch() calls it on every export.
    fake = types.ModuleType("torch")
    calls = []
    fake.from_dlpack = lambda x: calls.append(x) or np.from_dlpack(x)
    monkeypatch.setitem(sys.modules, "torch", fake)
    toy.add_request(list(range(20)), max_new_tokens=1)
    out = toy.schedule()
    tensors = out.to_torch()
    assert tensors["seq_lens"].tolist() == [20]
    assert [t[0, :2].tolist() for t in tensors["block_tables"]] == [[1, 2], [1, 2]]
    assert len(calls) == 7 + 2 + 2 + 1 + 1  # 7 arrays, 2 tables, 2 mappings, 1 + 1 state slots
    state = toy.cache(2, "recurrent_state", framework="torch")
    assert state.dtype == np.float32 and state.shape == (33, 1, 32, 32)


def test_to_torch_without_torch(toy, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    toy.add_request([1, 2, 3], max_new_tokens=1)
    out = toy.schedule()
    with pytest.raises(ImportError):
        out.to_torch()
    with pytest.raises(ImportError):
        toy.cache(0, framework="torch")


def test_real_torch_tensors():
    torch = pytest.importorskip("torch")
    s = host("qwen3-8b")
    key = s.cache(0, "key", framework="torch")
    assert key.dtype == torch.bfloat16 and tuple(key.shape) == (28, 16, 8, 128)
    assert key.stride() == (32768, 1024, 128, 1)  # elements: 65,536 / 2, 2,048 / 2, 256 / 2
    key[1, 0, 0, 0] = 1.0
    assert s.cache(0)[1, 0, 0, 0] == 0x3F80  # bf16 1.0, seen through the NumPy view
    s.add_request(list(range(20)), max_new_tokens=1)
    out = s.schedule()
    tensors = out.to_torch()
    assert tensors["seq_lens"].dtype == torch.int32 and tensors["seq_lens"].tolist() == [20]
    assert tensors["slot_mappings"][0].dtype == torch.int64
