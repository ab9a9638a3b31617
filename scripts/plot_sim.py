#!/usr/bin/env python3
"""Plot a `kvpage sim --output-dir DIR` run: DIR/steps.csv and DIR/requests.csv -> DIR/sim.png.

Usage:
    plot_sim.py --dir DIR [--title T] [--output FILE.png]

Three panels over simulated time: running and waiting requests; KV usage per pool (used
blocks' bytes over the KV budget); and the CDFs of TTFT and TPOT. Long runs are thinned to
at most 4,000 points per line (every k-th step), which keeps the PNG readable and fast.
"""

import argparse
import csv
import os
import sys

EXIT_BAD_INPUT = 2
MAX_POINTS = 4000


def fail(msg):
    print("plot_sim.py: error: " + msg, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def read_csv(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        fail("cannot read %s: %s" % (path, e))


def thin(rows):
    step = max(1, len(rows) // MAX_POINTS)
    return rows[::step]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--title", default="kvpage sim")
    p.add_argument("--output", default=None)
    args = p.parse_args()

    steps = thin(read_csv(os.path.join(args.dir, "steps.csv")))
    requests = read_csv(os.path.join(args.dir, "requests.csv"))
    if not steps:
        fail("no steps in %s" % args.dir)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_q, ax_kv, ax_cdf) = plt.subplots(3, 1, figsize=(9, 10))
    fig.suptitle(args.title)

    t = [float(s["time_s"]) for s in steps]
    ax_q.plot(t, [int(s["running"]) for s in steps], label="running", lw=1)
    ax_q.plot(t, [int(s["waiting"]) for s in steps], label="waiting", lw=1)
    ax_q.set_xlabel("simulated time (s)")
    ax_q.set_ylabel("requests")
    ax_q.legend(loc="upper left")
    ax_q.grid(alpha=0.3)

    pools = [k for k in steps[0].keys() if k.startswith("kv_usage_")]
    for k in pools:
        ax_kv.plot(t, [100.0 * float(s[k]) for s in steps], label=k[len("kv_usage_"):], lw=1)
    if len(pools) > 1:
        ax_kv.plot(t, [100.0 * sum(float(s[k]) for k in pools) for s in steps], label="total",
                   lw=1, color="black")
    ax_kv.set_xlabel("simulated time (s)")
    ax_kv.set_ylabel("KV budget used (%)")
    ax_kv.set_ylim(0, 105)
    ax_kv.legend(loc="upper left")
    ax_kv.grid(alpha=0.3)

    for col, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        values = sorted(float(r[col]) for r in requests if r[col] != "")
        if values:
            n = len(values)
            ax_cdf.plot(values, [(i + 1) / n for i in range(n)], label=label)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("ms (log scale)")
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.legend(loc="lower right")
    ax_cdf.grid(alpha=0.3)

    fig.tight_layout()
    out = args.output or os.path.join(args.dir, "sim.png")
    fig.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
