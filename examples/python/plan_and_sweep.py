"""Capacity and latency from a notebook: kvpage.plan and kvpage.simulate in a loop.

Left: the bytes one request reserves against its context under the three policies (kvpage's
pools, vLLM, llama.cpp). Right: a latency-throughput curve, `kvpage sim` over request rates on
synthetic requests (p99 TTFT and median TPOT against output tokens per second).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/plan_and_sweep.py --output sweep.png

(Any Python with numpy and matplotlib that can import the built module; `pip install .` puts
kvpage in the environment that ran it.)
"""

from __future__ import annotations

import argparse

import kvpage

POLICIES = ("kvpage", "vllm", "llamacpp")


def plan_sweep(model: kvpage.Model, contexts: list[int]) -> dict[str, list[float]]:
    """GiB one request reserves at each context, per policy."""
    return {
        policy: [r.reserved_bytes / 2**30 for r in kvpage.plan(model, contexts, policy=policy).rows]
        for policy in POLICIES
    }


def rate_sweep(model: kvpage.Model, gpu: str, rates: list[float], requests: int) -> list[dict]:
    points = []
    for rate in rates:
        r = kvpage.simulate(model, gpu=gpu, synthetic=requests, request_rate=rate,
                            prompt_len=2048, output_len=256, seed=0)
        s = r.summary
        points.append({"rate": rate, "output_throughput": s["output_throughput"],
                       "p99_ttft_ms": s["ttft_ms"]["p99"], "median_tpot_ms": s["tpot_ms"]["median"]})
        print(f"rate {rate:6.1f}/s: {s['output_throughput']:8.0f} tok/s, "
              f"p99 TTFT {s['ttft_ms']['p99']:8.1f} ms, median TPOT {s['tpot_ms']['median']:6.1f} ms")
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma-3-4b-it")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rates", default="2,4,8,16,32")
    parser.add_argument("--output", default="sweep.png")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = kvpage.load_model(args.model)
    contexts = [1024 << i for i in range(8)]  # 1K .. 128K
    plans = plan_sweep(model, contexts)
    points = rate_sweep(model, args.gpu, [float(x) for x in args.rates.split(",")], args.requests)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy, gib in plans.items():
        left.plot(contexts, gib, marker="o", label=policy)
    left.set(xscale="log", xlabel="context (tokens)", ylabel="GiB per request",
             title=f"{args.model}: memory one request reserves")
    left.legend()
    tput = [p["output_throughput"] for p in points]
    right.plot(tput, [p["p99_ttft_ms"] for p in points], marker="o", label="p99 TTFT")
    right.plot(tput, [p["median_tpot_ms"] for p in points], marker="s", label="median TPOT")
    for p in points:
        right.annotate(f"{p['rate']:g}/s", (p["output_throughput"], p["p99_ttft_ms"]))
    right.set(yscale="log", xlabel="output tokens/s", ylabel="ms",
              title=f"{args.model} on {args.gpu}: latency against throughput")
    right.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
