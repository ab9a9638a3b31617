#!/usr/bin/env python3
"""Plot reserved KV/state memory against context length from `kvpage plan --format json`.

Usage:
    plot_plan.py --input PLAN.json --output FILE.png [--title T]

The input is either one plan object or {"plans": [plan, ...]}; each plan has
"model", "policy", and "rows", where every row carries "context" (tokens) and
"reserved_bytes".  One line is drawn per (model, policy): colour identifies the
model, line style and marker identify the policy.
"""

import argparse
import json
import math
import sys

EXIT_BAD_INPUT = 2

# policy -> (line style, marker, hollow marker?)
POLICY_STYLE = {
    "kvpage": ("-", "o", False),
    "vllm": ("--", "s", True),
    "llamacpp": (":", "^", False),
}
FALLBACK_STYLES = [("-.", "D", True), ((0, (5, 1, 1, 1)), "v", False), ((0, (1, 3)), "P", False)]

MIB = float(1 << 20)


class InputError(Exception):
    pass


def fail(msg):
    print("plot_plan.py: error: " + msg, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def load_plans(path):
    try:
        with open(path, "r", encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise InputError("input file not found: %s" % path)
    except OSError as exc:
        raise InputError("cannot read input %s: %s" % (path, exc.strerror or exc))
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError("input %s is not valid JSON: %s (line %d, column %d)"
                         % (path, exc.msg, exc.lineno, exc.colno))

    if isinstance(doc, dict) and "plans" in doc:
        plans = doc["plans"]
        if not isinstance(plans, list) or not plans:
            raise InputError('"plans" in %s must be a non-empty array' % path)
    elif isinstance(doc, dict):
        plans = [doc]
    else:
        raise InputError("input %s must be a plan object or {\"plans\": [...]}, got %s"
                         % (path, type(doc).__name__))

    series = []
    for i, plan in enumerate(plans):
        where = "plan %d" % i if len(plans) > 1 else "plan"
        if not isinstance(plan, dict):
            raise InputError("%s in %s is not an object" % (where, path))
        rows = plan.get("rows")
        if rows is None:
            raise InputError('%s in %s lacks "rows" (is this `kvpage plan --format json` output?)'
                             % (where, path))
        if not isinstance(rows, list) or not rows:
            raise InputError('%s in %s has empty or non-array "rows"' % (where, path))
        model = str(plan.get("model", "?"))
        policy = str(plan.get("policy", "?"))
        pts = []
        for j, row in enumerate(rows):
            try:
                ctx = float(row["context"])
                reserved = float(row["reserved_bytes"])
            except (TypeError, KeyError, ValueError):
                raise InputError('%s (%s/%s) row %d in %s needs numeric "context" and "reserved_bytes"'
                                 % (where, model, policy, j, path))
            if ctx <= 0:
                continue  # cannot place on a log axis
            pts.append((ctx, reserved / MIB))
        if not pts:
            raise InputError("%s (%s/%s) in %s has no rows with context > 0"
                             % (where, model, policy, path))
        pts.sort()
        dtype = plan.get("kv_cache_dtype")
        series.append((model, policy, pts, "" if dtype is None else str(dtype)))
    return series


def context_label(tokens):
    t = int(round(tokens))
    if t >= 1 << 20 and t % (1 << 20) == 0:
        return "%dM" % (t >> 20)
    if t >= 1024 and t % 1024 == 0:
        return "%dK" % (t >> 10)
    if t >= 1024:
        return "%.1fK" % (t / 1024.0)
    return str(t)


def mib_label(v, _pos=None):
    if v >= 1:
        return "{:,.0f}".format(v)
    return "{:g}".format(v)


def plot(series, output, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, LogLocator

    models = []
    policies = []
    for model, policy, _pts, _dt in series:
        if model not in models:
            models.append(model)
        if policy not in policies:
            policies.append(policy)

    cmap = plt.get_cmap("tab10" if len(models) <= 10 else "tab20")
    colour = {m: cmap(i % cmap.N) for i, m in enumerate(models)}
    style = {}
    extra = 0
    for p in policies:
        if p in POLICY_STYLE:
            style[p] = POLICY_STYLE[p]
        else:
            style[p] = FALLBACK_STYLES[extra % len(FALLBACK_STYLES)]
            extra += 1

    fig, ax = plt.subplots(figsize=(11, 6.5), dpi=130)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")

    contexts = set()
    ymin = float("inf")
    ymax = 0.0
    z_order = {p: 2 + i for i, p in enumerate(policies)}  # later policies draw on top
    for model, policy, pts, _dt in series:
        xs = [p[0] for p in pts]
        ys = [max(p[1], 1e-6) for p in pts]  # keep zero-byte rows on the log axis
        contexts.update(xs)
        ymin = min(ymin, min(ys))
        ymax = max(ymax, max(ys))
        ls, mk, hollow = style[policy]
        # Hollow or white-edged markers keep coincident policies of one model apart.
        ax.plot(xs, ys, linestyle=ls, marker=mk, color=colour[model],
                linewidth=1.6, markersize=7 if hollow else 6, alpha=0.9,
                markerfacecolor="none" if hollow else colour[model],
                markeredgecolor=colour[model] if hollow else "white",
                markeredgewidth=1.3 if hollow else 0.7, zorder=z_order[policy])

    # x ticks: powers of two spanning the data, thinned to at most ~10 labels.
    lo = min(contexts)
    hi = max(contexts)
    e_lo = int(math.floor(math.log2(lo)))
    e_hi = int(math.ceil(math.log2(hi)))
    step = max(1, int(math.ceil((e_hi - e_lo + 1) / 10.0)))
    ticks = [2.0 ** e for e in range(e_lo, e_hi + 1, step)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: context_label(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo / 1.25, hi * 1.25)

    decades = math.log10(ymax / ymin) if ymax > ymin else 0.0
    subs = (1.0, 2.0, 5.0) if decades <= 4 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(mib_label))
    ax.grid(True, which="major", linestyle="-", linewidth=0.6, alpha=0.45)
    ax.grid(True, which="minor", axis="y", linestyle=":", linewidth=0.4, alpha=0.3)

    ax.set_xlabel("context length (tokens, log2 scale)")
    ax.set_ylabel("reserved memory (MiB, 1 MiB = 2^20 bytes; log scale)")
    dtypes = sorted({s[3] for s in series} - {""})
    if not title:
        title = "Reserved KV/state memory vs context"
        if dtypes:
            title += " (kv_cache_dtype: %s)" % ", ".join(dtypes)
    ax.set_title(title)

    # Two compact legends outside the axes: colour = model, style = policy.
    model_handles = [Line2D([0], [0], color=colour[m], linewidth=2.5) for m in models]
    policy_handles = [Line2D([0], [0], color="0.25", linestyle=style[p][0],
                             marker=style[p][1], linewidth=1.6, markersize=6,
                             markerfacecolor="none" if style[p][2] else "0.25")
                      for p in policies]
    leg_m = ax.legend(model_handles, models, title="model", loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), fontsize=8.5, title_fontsize=9,
                      frameon=False, handlelength=1.8)
    ax.add_artist(leg_m)
    leg_p = ax.legend(policy_handles, policies, title="policy", loc="lower left",
                      bbox_to_anchor=(1.01, 0.0), fontsize=8.5, title_fontsize=9,
                      frameon=False, handlelength=3.0)

    fig.tight_layout()
    fig.savefig(output, dpi=130, bbox_inches="tight", bbox_extra_artists=[leg_m, leg_p])
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Plot reserved memory vs context length from `kvpage plan --format json`.")
    ap.add_argument("--input", required=True, help="plan JSON (one plan or {\"plans\": [...]})")
    ap.add_argument("--output", required=True, help="output image, e.g. plan.png")
    ap.add_argument("--title", default=None, help="figure title")
    args = ap.parse_args(argv)

    try:
        series = load_plans(args.input)
    except InputError as exc:
        fail(str(exc))

    try:
        plot(series, args.output, args.title)
    except OSError as exc:
        print("plot_plan.py: error: cannot write %s: %s" % (args.output, exc.strerror or exc),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
