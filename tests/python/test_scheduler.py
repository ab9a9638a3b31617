"""kvpage.Scheduler: requests, steps as NumPy views, their lifetime, finishing and aborting."""

import numpy as np
import pytest

import kvpage

BLOCK = 16


@pytest.fixture
def model():
    return kvpage.load_model("qwen3-8b")


def make(model, **kwargs):
    kwargs.setdefault("kv_budget_bytes", 1 << 30)
    kwargs.setdefault("hash_seed", 1)
    return kvpage.Scheduler(model, **kwargs)


def test_prefill_then_decode_views(model):
    s = make(model)
    a = s.add_request(list(range(40)), max_new_tokens=3)
    b = s.add_request(np.arange(100, 120, dtype=np.int32), max_new_tokens=2)
    assert (a.id, b.id) == (0, 1) and int(b) == 1

    out = s.schedule()
    assert out.step == 1 and out.num_rows == 2 and out.num_requests == 2
    assert list(out.request_ids) == [0, 1]
    assert list(out.num_scheduled_tokens) == [40, 20]
    assert list(out.num_computed_tokens) == [0, 0]
    assert list(out.samples) == [True, True]
    assert out.total_num_scheduled_tokens == 60
    assert list(out.query_start_loc) == [0, 40, 60]
    assert list(out.seq_lens) == [40, 20]
    (table,) = out.block_tables
    assert table.shape[0] == 2 and table.dtype == np.int32
    # 40 tokens fill 3 blocks of 16, 20 tokens 2; unused entries are 0.
    assert np.count_nonzero(table[0]) == 3 and np.count_nonzero(table[1]) == 2
    (slots,) = out.slot_mappings
    assert slots.dtype == np.int64 and len(slots) == 60
    assert slots[0] == table[0, 0] * BLOCK and slots[40] == table[1, 0] * BLOCK
    assert slots[17] == table[0, 1] * BLOCK + 1
    with pytest.raises(ValueError):
        table[0, 0] = 7  # read-only: the scheduler's own memory
    assert out.attention_groups[0]["kind"] == "full_attention"
    del table, slots
    assert s.update(out, np.array([7, 8], dtype=np.int32)) == []

    out = s.schedule()
    assert list(out.num_scheduled_tokens) == [1, 1]
    assert list(out.seq_lens) == [41, 21]
    assert out.one_sample_each
    finished = s.update(out, np.array([9, 10], dtype=np.int32))
    assert [(f.id, f.reason, f.num_output_tokens) for f in finished] == [(1, "length", 2)]
    s.check_invariants()
    assert s.num_running == 1


def test_stale_output_raises(model):
    s = make(model)
    s.add_request(list(range(20)), max_new_tokens=4)
    out = s.schedule()
    s.update(out, np.array([1], dtype=np.int32))
    later = s.schedule()
    with pytest.raises(RuntimeError, match="stale"):
        out.seq_lens
    with pytest.raises(RuntimeError, match="stale"):
        s.update(out, np.array([1], dtype=np.int32))
    assert list(later.seq_lens) == [21]


def test_schedule_refuses_while_views_are_alive(model):
    s = make(model)
    s.add_request(list(range(20)), max_new_tokens=4)
    out = s.schedule()
    view = out.seq_lens
    keep = np.array(out.block_tables[0])  # a copy: no view left behind
    s.update(out, np.array([1], dtype=np.int32))
    with pytest.raises(RuntimeError, match="1 array"):
        s.schedule()
    with pytest.raises(RuntimeError, match="1 array"):
        s.abort(0)
    del view
    out = s.schedule()
    assert list(out.seq_lens) == [21]
    assert keep.shape[0] == 1


def test_views_keep_the_scheduler_alive(model):
    s = make(model)
    s.add_request(list(range(20)), max_new_tokens=4)
    seq_lens = s.schedule().seq_lens
    del s
    assert list(seq_lens) == [20]


def test_finish_and_abort(model):
    s = make(model)
    a = s.add_request(list(range(20)), max_new_tokens=8)
    b = s.add_request(list(range(50, 70)), max_new_tokens=8, request_id=41)
    assert b.id == 41
    assert s.add_request([1, 2, 3]).id == 42
    out = s.schedule()
    s.update(out, np.array([1, 2, 3], dtype=np.int32))
    done = s.finish(a, reason="stop")
    assert (done.id, done.reason, done.num_output_tokens) == (0, "stop", 1)
    s.abort(b)
    with pytest.raises(KeyError):
        s.abort(b)
    with pytest.raises(KeyError):
        s.finish(99)
    with pytest.raises(ValueError, match="reason"):
        s.finish(42, reason="bored")
    out = s.schedule()
    assert sorted(out.finished_ids) == [0, 41]
    assert list(out.request_ids) == [42]
    s.check_invariants()


def test_errors(model):
    with pytest.raises(ValueError):
        kvpage.Scheduler(model, kv_budget_bytes=0)
    with pytest.raises(ValueError, match="scheduling_policy"):
        make(model, scheduling_policy="lifo")
    s = make(model)
    with pytest.raises(ValueError):
        s.add_request([])
    with pytest.raises(ValueError):
        s.add_request([1, 2], max_new_tokens=0)
    with pytest.raises(ValueError):
        s.add_request([-1])
    s.add_request([1, 2], request_id=5)
    with pytest.raises(RuntimeError):
        s.add_request([1, 2], request_id=5)
    out = s.schedule()
    with pytest.raises(ValueError):
        s.update(out, np.array([1, 2, 3], dtype=np.int32))  # one request samples


def test_a_full_run_matches_the_scheduler_invariants(model):
    # 64 requests through a small cache: preemptions happen, every request finishes.
    s = make(model, kv_budget_bytes=64 << 20, max_num_seqs=16, max_num_batched_tokens=512)
    rng = np.random.default_rng(0)
    for i in range(64):
        s.add_request(rng.integers(0, 1000, size=int(rng.integers(10, 200))).tolist(),
                      max_new_tokens=int(rng.integers(1, 40)))
    finished = []
    steps = 0
    while s.has_unfinished_requests:
        out = s.schedule()
        tokens = np.full(int(np.count_nonzero(out.samples)), 5, dtype=np.int32)
        finished += s.update(out, tokens)
        s.check_invariants()
        steps += 1
        assert steps < 10_000
    assert sorted(f.id for f in finished) == list(range(64))
