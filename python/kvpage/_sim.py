"""kvpage.simulate: `kvpage sim` from Python, with per-request NumPy arrays."""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

import numpy as np

from . import _kvpage
from ._flags import flag_args, python_messages, signature_defaults
from ._plan import ModelLike, _cli_model
from ._results import optional_pandas

# Next to the compiled module: the package directory of a build tree or an install, and
# site-packages (not the source tree) under `pip install -e .`.
_BUNDLED_TRACES = os.path.join(os.path.dirname(_kvpage.__file__), "data", "traces")
_LATENCY_KEY = re.compile(r"^(mean|median|std|p90|p99)_(ttft|tpot|itl|e2el)_ms$")

REQUEST_FIELDS = (
    "index", "arrival_s", "first_token_s", "finish_s",
    "prompt_len", "output_len", "hit_tokens", "num_preemptions",
)


@dataclass(frozen=True)
class RequestRecords:
    """The finished requests of a run, one read-only NumPy array per field, in trace order.

    index (int64, the trace position), arrival_s, first_token_s, finish_s (float64, virtual
    seconds), prompt_len, output_len (int32), hit_tokens (int64, prompt tokens the prefix
    cache served at the first admission), num_preemptions (int32).
    """

    index: np.ndarray
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    hit_tokens: np.ndarray
    num_preemptions: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def e2el_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    def to_dict(self) -> Dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in REQUEST_FIELDS}

    def to_pandas(self) -> Any:
        return optional_pandas().DataFrame(self.to_dict())


class JsonResult:
    """A result kept as the CLI's JSON (`_json`): to_dict(), and summary with the latency
    statistics grouped: summary["ttft_ms"]["p99"] for "p99_ttft_ms"."""

    _json: str

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(self._json)

    @property
    def summary(self) -> Dict[str, Any]:
        return grouped_summary(self.to_dict())


@dataclass(frozen=True)
class SimResult(JsonResult):
    """One `kvpage sim` run.

    `to_dict()` is the JSON `kvpage sim --output-json -` prints for the same arguments
    (`wall_seconds` aside, the one field that is not deterministic); `summary` the same dict
    with the latency statistics grouped.
    """

    allocator: str
    requests: RequestRecords
    _json: str

    def to_pandas(self) -> Any:
        """The per-request records as a DataFrame."""
        return self.requests.to_pandas()


def grouped_summary(result: Dict[str, Any]) -> Dict[str, Any]:
    """The result with its latency statistics grouped: out["ttft_ms"]["p99"] for "p99_ttft_ms"."""
    out: Dict[str, Any] = {}
    for key, value in result.items():
        match = _LATENCY_KEY.match(key)
        if match:
            out.setdefault(match.group(2) + "_ms", {})[match.group(1)] = value
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_trace(trace: Optional[str]) -> Optional[str]:
    """A bare name that is not a file here is looked up among the bundled traces."""
    if trace is None or os.path.exists(trace) or "/" in trace:
        return trace
    bundled = os.path.join(_BUNDLED_TRACES, trace)
    return bundled if os.path.exists(bundled) else trace


def records(columns: Dict[str, np.ndarray]) -> RequestRecords:
    for array in columns.values():
        array.flags.writeable = False
    return RequestRecords(**columns)


@python_messages
def simulate(
    model: ModelLike,
    *,
    gpu: str,
    trace: Optional[str] = None,
    trace_format: str = "auto",
    kv_budget_gib: Optional[float] = None,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    max_model_len: Optional[int] = None,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
    scheduling_policy: str = "fcfs",
    enable_prefix_caching: bool = True,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    allocator: str = "kvpage",
    vllm_version: Optional[str] = None,
    kv_chunk_mib: int = 2,
    max_requests: Optional[int] = None,
    request_rate: Optional[float] = None,
    arrival: str = "poisson",
    synthetic: Optional[int] = None,
    prompt_len: int = 1024,
    output_len: int = 128,
    shared_prefix_fraction: float = 0.0,
    num_prefix_groups: int = 1,
    seed: int = 0,
    host_cache_gib: Optional[float] = None,
    host_policy: str = "write-through",
    pcie_gbps: float = 32.0,
) -> SimResult:
    """Replays a trace through kvpage's scheduler on a simulated GPU: `kvpage sim`.

    Every keyword is the CLI flag of the same name (`kvpage sim --help`), with its default;
    None leaves the flag out (the model's max_position_embeddings, the whole trace, ...).
    `trace` is a path or the name of a bundled trace ("mooncake_conversation_trace.jsonl");
    `synthetic=N` generates N requests instead. The GIL is released while it runs.
    Raises ValueError for a bad argument, KeyError for an unknown model or GPU, MemoryError
    when a request can never fit the KV budget.
    """
    values = {k: v for k, v in locals().items() if k != "model"}
    values["trace"] = resolve_trace(trace)
    args = ["--model", _cli_model(model), "--no-progress"]
    args += flag_args(values, SIM_DEFAULTS)
    text, allocators, requests = _kvpage._simulate(args)
    return SimResult(allocator=allocators[0], requests=records(requests[0]), _json=text)


SIM_DEFAULTS = signature_defaults(simulate)
