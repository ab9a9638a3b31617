"""kvpage from Python: the capacity planner, the trace simulator and the scheduler.

    import kvpage
    m = kvpage.load_model("qwen3-8b")                    # or a path to any config.json
    p = kvpage.plan(m, contexts=[4096, 32768], policy="vllm", gpu="h100")
    r = kvpage.simulate(m, gpu="h100", trace="mooncake_conversation_trace.jsonl",
                        max_requests=2000)
    r.summary["ttft_ms"]["p99"], r.requests.ttft_s
    s = kvpage.Scheduler(m, kv_budget_bytes=1 << 30, backing="host")
    out = s.schedule()                                   # NumPy views; out.to_torch()
    k = s.cache(0, "key")                                # layer 0's K in kvpage's memory

Errors raise ValueError (bad argument), KeyError (unknown model, GPU or request),
MemoryError (the KV budget cannot hold it) or RuntimeError, with kvpage's message.
"""

from ._kvpage import (
    FinishedRequest,
    Model,
    Request,
    Scheduler,
    StepOutput,
    bundled_gpus,
    bundled_models,
    load_model,
)
from ._plan import GroupReservation, Plan, PlanRow, plan
from ._sim import RequestRecords, SimResult, simulate

__all__ = [
    "Model", "load_model", "bundled_models", "bundled_gpus",
    "plan", "Plan", "PlanRow", "GroupReservation",
    "simulate", "SimResult", "RequestRecords",
    "Scheduler", "StepOutput", "Request", "FinishedRequest",
]
