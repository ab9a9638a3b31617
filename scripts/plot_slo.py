#!/usr/bin/env python3
"""Plot `kvpage plan --slo` results: each SLO metric against GPUs, per (tp, router).

Usage:
    plot_slo.py --input SLO.json --output FILE.png

The input is `kvpage plan --trace ... --slo ... --format json`: "slo" lists the terms
({"metric", "limit_ms"}); "searches" holds one object per (tp, router) with its "probes"
({"gpus", "met", "values_ms": {metric: ms}}); "answer" is the chosen configuration or null.
One panel per SLO term (log-scale latency against GPUs), one line per search through the
counts it simulated, the limit as a dashed line and the answer as a star.
"""

import argparse
import json
import sys

EXIT_BAD_INPUT = 2


def fail(msg):
    print("plot_slo.py: error: " + msg, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail("cannot read %s: %s" % (path, e))
    for key in ("slo", "searches", "model", "gpu"):
        if key not in doc:
            fail("%s has no %r field" % (path, key))
    if not doc["slo"]:
        fail("%s has no SLO term" % path)
    return doc


def draw(doc, output):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    terms = doc["slo"]
    fig, axes = plt.subplots(1, len(terms), figsize=(5.5 * len(terms), 4.2), squeeze=False)
    answer = doc.get("answer")
    # Colour names the router, line style and marker the tp; equal results stay visible.
    routers = sorted({s["router"] for s in doc["searches"]})
    tps = sorted({s["tp"] for s in doc["searches"]})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    for ax, term in zip(axes[0], terms):
        metric = term["metric"]
        for s in doc["searches"]:
            probes = sorted(s["probes"], key=lambda p: p["gpus"])
            if not probes:
                continue
            xs = [p["gpus"] for p in probes]
            ys = [max(p["values_ms"][metric], 1e-3) for p in probes]
            style, marker = styles[tps.index(s["tp"]) % len(styles)]
            colour = colours[routers.index(s["router"]) % len(colours)]
            line, = ax.plot(xs, ys, linestyle=style, marker=marker, color=colour, alpha=0.85,
                            label="tp %d, %s" % (s["tp"], s["router"]))
            met = [(x, y) for x, y, p in zip(xs, ys, probes) if p["met"]]
            if met:
                ax.scatter(*zip(*met), s=70, facecolors="none", edgecolors=line.get_color())
        ax.axhline(term["limit_ms"], color="black", linestyle="--", linewidth=1,
                   label="limit %g ms" % term["limit_ms"])
        if answer:
            ax.scatter([answer["gpus"]], [max(answer["values_ms"][metric], 1e-3)], marker="*",
                       s=250, color="gold", edgecolors="black", zorder=5, label="answer")
        ax.set_yscale("log")
        ax.set_xlabel("GPUs (replicas x tp)")
        ax.set_ylabel("%s (ms)" % metric)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    title = "%s on %s: %d requests of %s" % (doc["model"], doc["gpu"], doc.get("requests", 0),
                                             doc.get("trace", "?"))
    if answer:
        title += " -- answer: %d GPUs (tp %d, %d replicas, %s)" % (
            answer["gpus"], answer["tp"], answer["replicas"], answer["router"])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    draw(load(args.input), args.output)


if __name__ == "__main__":
    main()
