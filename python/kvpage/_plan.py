"""kvpage.plan: `kvpage plan` from Python, results as frozen objects."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from . import _kvpage
from ._flags import flag_args, python_messages, signature_defaults
from ._results import records_frame

ModelLike = Union["_kvpage.Model", str]


@dataclass(frozen=True)
class GroupReservation:
    """One layer group as the policy lays it out (kvpage::GroupReservation)."""

    kind: str
    num_layers: int
    padding_layers: int
    block_size: int
    blocks: int
    reserved_bytes: int

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PlanRow:
    """What one request of `context` tokens reserves (kvpage::PlanRow).

    `vllm_starts` (and, when False, `refusal` and `fix`) are set under the vllm policy only.
    """

    context: int
    reserved_bytes: int
    kv_bytes: int
    state_bytes: int
    shared_bytes: int
    snapshot_bytes: int
    bytes_per_token: float
    max_concurrency: Optional[int]
    groups: Tuple[GroupReservation, ...]
    vllm_starts: Optional[bool] = None
    refusal: Optional[str] = None
    fix: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "groups"}
        d["groups"] = [g.to_dict() for g in self.groups]
        # Key order and presence of the CLI's JSON.
        for key in ("vllm_starts", "refusal", "fix"):
            value = d.pop(key)
            if value is not None:
                d[key] = value
        return d


@dataclass(frozen=True)
class Plan:
    """One model under one policy at each context (kvpage::Plan).

    `to_dict()` equals the JSON `kvpage plan --format json` prints for the same arguments.
    With tp > 1 every byte count is one GPU's share.
    """

    model: str
    policy: str
    kv_cache_dtype: str
    tp: int
    kv_budget_bytes: Optional[int]
    rows: Tuple[PlanRow, ...]
    # vllm policy with a budget from `gpu`: the estimated activation, CUDA-graph and non-torch
    # bytes taken from it ({"activation_bytes": ..., "cuda_graph_bytes": ...,
    # "non_torch_bytes": ...}); None otherwise.
    vllm_runtime: Optional[Dict[str, int]] = None

    @staticmethod
    def from_json(text: str) -> "Plan":
        j = json.loads(text)
        rows = tuple(
            PlanRow(
                **{k: v for k, v in r.items() if k != "groups"},
                groups=tuple(GroupReservation(**g) for g in r["groups"]),
            )
            for r in j["rows"]
        )
        return Plan(
            model=j["model"],
            policy=j["policy"],
            kv_cache_dtype=j["kv_cache_dtype"],
            tp=j.get("tp", 1),
            kv_budget_bytes=j["kv_budget_bytes"],
            rows=rows,
            vllm_runtime=j.get("vllm_runtime"),
        )

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "model": self.model,
            "policy": self.policy,
            "kv_cache_dtype": self.kv_cache_dtype,
        }
        if self.tp > 1:
            d["tp"] = self.tp
        d["kv_budget_bytes"] = self.kv_budget_bytes
        if self.vllm_runtime is not None:
            d["vllm_runtime"] = dict(self.vllm_runtime)
        d["rows"] = [r.to_dict() for r in self.rows]
        return d

    def to_pandas(self) -> Any:
        """One row per context: model, policy and the row's numbers (groups left out)."""
        return records_frame(
            [
                {"model": self.model, "policy": self.policy, "tp": self.tp,
                 **{k: v for k, v in r.to_dict().items() if k != "groups"}}
                for r in self.rows
            ]
        )


def _cli_model(model: ModelLike) -> str:
    return model if isinstance(model, str) else model.cli_name


@python_messages
def plan(
    model: ModelLike,
    contexts: Sequence[Union[int, str]] = (4096, 32768, 131072),
    *,
    policy: str = "kvpage",
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    max_num_batched_tokens: int = 8192,
    enable_prefix_caching: bool = True,
    async_scheduling: bool = True,
    vllm_version: Optional[str] = None,
    max_num_seqs: int = 1024,
    enforce_eager: bool = False,
    tp: int = 1,
    ubatch: int = 512,
    batch: int = 2048,
    parallel: int = 1,
    kv_unified: bool = False,
    swa_full: bool = False,
    gpu: Optional[str] = None,
    gpu_memory_utilization: float = 0.9,
    kv_budget_gib: Optional[float] = None,
) -> Plan:
    """How many bytes one request of each context reserves, and how many fit: `kvpage plan`.

    Every keyword is the CLI flag of the same name (`kvpage plan --help`), with its default;
    `vllm_version=None` is the CLI's default release. `contexts` takes token counts or the
    CLI's "32K" spellings. A budget comes from `gpu` (memory x gpu_memory_utilization minus
    weights, and under policy="vllm" minus vLLM's estimated runtime memory, `vllm_runtime`)
    or `kv_budget_gib`; with one, each row's max_concurrency is set.
    Raises ValueError for a bad argument, KeyError for an unknown model or GPU.
    """
    values = {
        k: v for k, v in locals().items() if k not in ("model", "contexts")
    }
    args = ["--model", _cli_model(model), "--context", ",".join(str(c) for c in contexts)]
    args += flag_args(values, _PLAN_DEFAULTS)
    (text,) = _kvpage._plan_json(args)
    return Plan.from_json(text)


_PLAN_DEFAULTS = signature_defaults(plan)
