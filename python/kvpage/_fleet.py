"""The fleet questions from Python: `kvpage sim --replicas` and `kvpage plan --slo`.

    r = kvpage.simulate_fleet(m, gpu="h100", replicas=4, router="prefix-aware",
                              trace="mooncake_conversation_trace.jsonl", max_requests=1000)
    r.summary["ttft_ms"]["p99"], r.per_replica[0]["hit_rate"]
    p = kvpage.plan_slo(m, gpu="h100", trace="mooncake_conversation_trace.jsonl",
                        slo="ttft-p99=3s,tpot-p99=100ms", max_requests=1000, tp=[1, 2])
    p.answer["gpus"], p.to_pandas()          # the answer, and one row per simulation run
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _kvpage
from ._flags import flag_args, python_messages, signature_defaults
from ._plan import ModelLike, _cli_model
from ._results import records_frame
from ._sim import SIM_DEFAULTS, JsonResult, RequestRecords, records, resolve_trace


@dataclass(frozen=True)
class FleetResult(JsonResult):
    """One `kvpage sim --replicas N --router R` run.

    `to_dict()` is the JSON the CLI prints for the same arguments (`wall_seconds` aside);
    `summary` groups its latency statistics as SimResult.summary does; `per_replica` is one
    dict per replica (routed, completed, busy_s, hit_rate, kv_usage_peak, preemptions,
    num_steps); `requests` the fleet's finished requests in trace order.
    """

    router: str
    replicas: int
    requests: RequestRecords
    _json: str

    @property
    def per_replica(self) -> List[Dict[str, Any]]:
        return self.to_dict()["per_replica"]

    def to_pandas(self) -> Any:
        """One row per replica."""
        return records_frame(self.per_replica)


@python_messages
def simulate_fleet(
    model: ModelLike,
    *,
    gpu: str,
    replicas: int,
    router: str = "round-robin",
    overlap_weight: float = 1.0,
    **options: Any,
) -> FleetResult:
    """`replicas` copies of the server behind `router` on one virtual clock: `kvpage sim
    --replicas`. `router` is round-robin, least-loaded, prefix-aware or kv-events;
    `overlap_weight` weighs the cached prefix against load (prefix-aware, kv-events).
    `options` are simulate()'s keywords (trace, max_requests, tp, ...) with its defaults.
    The GIL is released while it runs. Raises as simulate() does; TypeError for a keyword
    simulate() does not take.
    """
    unknown = sorted(set(options) - set(SIM_DEFAULTS))
    if unknown:
        raise TypeError(f"simulate_fleet() got unexpected keyword arguments: {unknown}")
    values = dict(options, gpu=gpu)
    if "trace" in values:
        values["trace"] = resolve_trace(values["trace"])
    args = ["--model", _cli_model(model), "--no-progress",
            "--replicas", str(replicas), "--router", router]
    if overlap_weight != 1.0:
        args += ["--overlap-weight", repr(float(overlap_weight))]
    args += flag_args(values, SIM_DEFAULTS)
    text, columns = _kvpage._simulate_fleet(args)
    return FleetResult(router=router, replicas=replicas, requests=records(columns), _json=text)


@dataclass(frozen=True)
class SloPlan:
    """`kvpage plan --trace --slo`: one replica search per (tp, router) and the answer.

    `to_dict()` is the JSON `kvpage plan --format json` prints for the same arguments;
    `answer` is its "answer" ({"tp", "router", "replicas", "gpus", "values_ms"}: the fewest
    GPUs that met every SLO term) or None when no search did; `searches` its "searches".
    """

    _json: str

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(self._json)

    @property
    def answer(self) -> Optional[Dict[str, Any]]:
        return self.to_dict()["answer"]

    @property
    def searches(self) -> List[Dict[str, Any]]:
        return self.to_dict()["searches"]

    def probes(self) -> List[Dict[str, Any]]:
        """One flat dict per simulation run: tp, router, replicas, gpus, completed, met, and
        each SLO metric's value in ms."""
        rows = []
        for search in self.searches:
            for probe in search["probes"]:
                row = {"tp": search["tp"], "router": search["router"]}
                row.update({k: v for k, v in probe.items() if k != "values_ms"})
                row.update(probe["values_ms"])
                rows.append(row)
        return rows

    def to_pandas(self) -> Any:
        """probes() as a DataFrame."""
        return records_frame(self.probes())


@python_messages
def plan_slo(
    model: ModelLike,
    *,
    trace: str,
    slo: Union[str, Mapping[str, str]],
    gpu: str,
    max_requests: Optional[int] = None,
    routers: Sequence[str] = ("round-robin", "least-loaded", "prefix-aware", "kv-events"),
    tp: Sequence[int] = (1,),
    jobs: Optional[int] = None,
    max_replicas: int = 256,
    gpu_memory_utilization: float = 0.9,
    seed: int = 0,
) -> SloPlan:
    """The fewest GPUs, over routers and tensor-parallel degrees, whose fleet replays `trace`
    within `slo`: `kvpage plan --trace --slo`. `slo` is the CLI's text
    ("ttft-p99=3s,tpot-p99=100ms") or a mapping {"ttft-p99": "3s", ...}. Every other
    keyword is the CLI flag of the same name (`kvpage plan --slo --help`), with its default.
    The GIL is released while the searches run. Raises ValueError for a bad argument,
    KeyError for an unknown model or GPU.
    """
    if isinstance(slo, Mapping):
        slo = ",".join(f"{metric}={limit}" for metric, limit in slo.items())
    values = {k: v for k, v in locals().items() if k not in ("model", "trace", "slo")}
    args = ["--model", _cli_model(model), "--trace", resolve_trace(trace) or trace, "--slo", slo]
    args += flag_args(values, _SLO_DEFAULTS)
    return SloPlan(_json=_kvpage._plan_slo_json(args))


_SLO_DEFAULTS = signature_defaults(plan_slo)
