#!/usr/bin/env python3
"""Fits kvpage's calibrated step-time model to per-operation GPU profiles.

Reads profiles in the layout and column names of the Vidur profiler (microsoft/vidur,
data/profiling/):
  compute/<gpu>/<org>/<model>/mlp.csv   per-layer op times (ms) against num_tokens and tp
  network/<gpu>_dgx/all_reduce.csv      all-reduce times (ms) against size (bytes)
Either Vidur's full files or the trimmed copies in sim/data/profiling/vidur/ (same columns,
medians only, every token count up to 8,192 and a ladder above; `--trim` writes them) can be
read.

What it fits, per GPU and tensor-parallel degree (docs/simulator.md gives the model):
  * linear layers, one GEMM of M = tokens rows, N columns and depth K (per GPU) at a time:
      t = launch + max(W / (B * hbm_eff), Q * F / (P * eff(tokens)))
    W = N * K * 2 weight bytes, F = 2 * M * N * K FLOPs, B and P the datasheet bandwidth
    and peak; launch and hbm_eff by weighted least squares on steps of 1-8 tokens, eff at
    each token count of the profile by a one-dimensional search. Q >= 1 is the tile
    quantization (--tiles; 1 without it): the GEMM's output is cut into tm x tn tiles that
    run in waves of --sm-count at a time, each tile over K cut into s = 1 .. --split-k slices
    of K' = K / s rounded up to --k-multiple,
      Q = min over tiles and s of ceil(s * ceil(M/tm) * ceil(N/tn) / SMs) * SMs * tm * tn * K'
          / (M * N * K).
    --select-tiles picks the tile set by leave-one-model-out error on the fitted models.
  * small kernels (norms, rope, activation, residual add, embedding): t = a + b * elements.
  * all-reduce: the measured medians on one node, as a table.
Models named in --hold-out are left out of every fit and scored: the script prints their
error per operation and for the sum of the linear layers, and the worst cell.
--monotone-bound prints, per model and tp, the least worst-cell error that any model whose
linear time never falls as tokens grow can reach on the measured medians.

Standard library only. Example (what produced the bundled constants; the H100 file adds
--tiles 64x128,128x128 --k-multiple 512 --sm-count 132):
  python3 scripts/fit_cost_model.py --profiles sim/data/profiling/vidur --gpu a100 \
      --hardware sim/data/hardware/a100-sxm-80gb.json \
      --hold-out Meta-Llama-3-8B,phi-2 --write
"""

import argparse
import bisect
import csv
import glob
import json
import math
import os
import re
import sys

LINEAR_OPS = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"]
# Small kernels and the width each one's element count scales with: "hidden" (tokens x
# hidden, replicated on every GPU) or "hidden_per_tp" (tokens x hidden / tp, split by TP).
# Per layer except the embedding, which runs once per step.
SMALL_OPS = [
    ("input_layernorm", "hidden", "layer"),
    ("post_attention_layernorm", "hidden", "layer"),
    ("attn_rope", "hidden_per_tp", "layer"),
    ("mlp_act", "hidden_per_tp", "layer"),
    ("add", "hidden", "layer"),
    ("emb", "hidden", "step"),
]
# Token counts kept by --trim: every profiled count up to TRIM_ALL_UP_TO (the efficiency
# curve needs them: GEMM times jump between neighbouring counts, and a curve fitted on a
# sparse ladder misses those jumps), and above it those on this ladder.
TRIM_ALL_UP_TO = 8192
TRIM_TOKENS = sorted({1, 2, 4, 8} | {b * m for b in (16, 24) for m in (1, 2, 4, 8, 16, 32, 64,
                                                                          128, 256, 512, 1024, 2048)})
TRIM_COLUMNS_TAIL = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                     "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"]
BYTES_PER_PARAM = 2  # the profiles are fp16/bf16


def read_compute(profiles, gpu):
    """Rows of (model, tp, tokens, shape, {op: seconds})."""
    rows = []
    for path in sorted(glob.glob(os.path.join(profiles, "compute", gpu, "*", "*", "mlp.csv"))):
        model = os.path.basename(os.path.dirname(path))
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                times = {}
                for op in LINEAR_OPS + [s[0] for s in SMALL_OPS]:
                    v = r.get("time_stats.%s.median" % op, "")
                    if v != "":
                        times[op] = float(v) * 1e-3
                rows.append(dict(model=model, tp=int(r["num_tensor_parallel_workers"]),
                                 tokens=int(r["num_tokens"]), n_head=int(r["n_head"]),
                                 n_kv_head=int(r["n_kv_head"]), hidden=int(r["n_embd"]),
                                 ffn=int(r["n_expanded_embd"]),
                                 gated=r["use_gated_mlp"] == "True", times=times))
    return rows


def gemm_shapes(row):
    """(K, N) per GPU of each linear op: x[tokens, K] @ W[K, N]."""
    h, tp, d = row["hidden"], row["tp"], row["hidden"] // row["n_head"]
    up = (2 if row["gated"] else 1) * row["ffn"]
    return {"attn_pre_proj": (h, (row["n_head"] + 2 * row["n_kv_head"]) * d // tp),
            "attn_post_proj": (row["n_head"] * d // tp, h),
            "mlp_up_proj": (h, up // tp),
            "mlp_down_proj": (row["ffn"] // tp, h)}


def ceil_div(a, b):
    return -(-a // b)


def quantization(tokens, k, n, tiles):
    """Q >= 1: work of the whole waves of output tiles (and K rounded up) over the GEMM's
    own work; 1 when `tiles` is None. `tiles`: dict(sm_count, tiles [(tm, tn)], k_multiple,
    split_k). Each tile may be split along K into s = 1 .. split_k slices of K / s rounded up
    to k_multiple, s times the tiles; the least work wins.
    Must match TileQuantization::Factor in sim/hardware_calibration.cc."""
    if not tiles:
        return 1.0
    sms, kq = tiles["sm_count"], tiles["k_multiple"]
    best = None
    for s in range(1, tiles.get("split_k", 1) + 1):
        k_slice = ceil_div(ceil_div(k, s), kq) * kq
        for tm, tn in tiles["tiles"]:
            work = ceil_div(ceil_div(tokens, tm) * ceil_div(n, tn) * s, sms) * tm * tn * k_slice
            if best is None or work < best:
                best = work
    return best * sms / (tokens * n * k)


def gemm_time(tokens, k, n, launch, hbm_eff, eff, peak, bw, tiles):
    memory = k * n * BYTES_PER_PARAM / (bw * hbm_eff)
    compute = 2.0 * tokens * k * n * quantization(tokens, k, n, tiles) / (peak * eff)
    return launch + max(memory, compute)


def weighted_line(xs, ys):
    """Least squares y = a + b x minimising relative error (weights 1 / y^2)."""
    sw = sx = sy = sxx = sxy = 0.0
    for x, y in zip(xs, ys):
        w = 1.0 / (y * y)
        sw += w; sx += w * x; sy += w * y; sxx += w * x * x; sxy += w * x * y
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    return a, b


def interp_log2(xs, ys, x):
    """Piecewise linear in log2(x) through (xs, ys), clamped at the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x) - 1
    f = (math.log2(x) - math.log2(xs[i])) / (math.log2(xs[i + 1]) - math.log2(xs[i]))
    return ys[i] + f * (ys[i + 1] - ys[i])


def fit_gemm(rows, peak, bw, tiles):
    """One GPU and tp: launch, hbm_eff and the efficiency curve over tokens."""
    samples = []  # (tokens, K, N, seconds)
    for r in rows:
        for op, (k, n) in gemm_shapes(r).items():
            if op in r["times"]:
                samples.append((r["tokens"], k, n, r["times"][op]))
    small = [(k * n, t) for m, k, n, t in samples if m <= 8]
    a, b = weighted_line([p * BYTES_PER_PARAM for p, _ in small], [t for _, t in small])
    launch, hbm_eff = max(a, 0.0), min(1.0 / (b * bw), 1.0)
    tokens, effs = [], []
    for m in sorted({s[0] for s in samples}):
        # Per sample: weight-read time, compute time at efficiency 1, measured time.
        at = [(k * n * BYTES_PER_PARAM / (bw * hbm_eff),
               2.0 * m * k * n * quantization(m, k, n, tiles) / peak, t)
              for mm, k, n, t in samples if mm == m]

        def loss(eff):
            return sum(math.log((launch + max(memory, work / eff)) / t) ** 2
                       for memory, work, t in at)
        grid = [10 ** (-3 + 3 * i / 2000) for i in range(2001)]  # 0.001 .. 1
        losses = [loss(e) for e in grid]
        best = min(losses)
        # Where memory bounds every sample the loss is flat: keep the smallest efficiency
        # that is as good, so the curve rises smoothly into the compute-bound range.
        eff = next(e for e, l in zip(grid, losses) if l <= best * (1 + 1e-9) + 1e-15)
        tokens.append(m)
        effs.append(round(eff, 4))
    return dict(launch_us=round(launch * 1e6, 3), hbm_efficiency=round(hbm_eff, 4),
                tokens=tokens, efficiency=effs)


def predict_linear(curve, k, n, tokens, peak, bw, tiles):
    eff = interp_log2(curve["tokens"], curve["efficiency"], tokens)
    return gemm_time(tokens, k, n, curve["launch_us"] * 1e-6, curve["hbm_efficiency"], eff,
                     peak, bw, tiles)


def parse_tiles(text, k_multiple, sm_count, split_k=1):
    if not sm_count or sm_count < 1 or k_multiple < 1 or split_k < 1:
        sys.exit("--tiles needs --sm-count >= 1, --k-multiple >= 1 and --split-k >= 1")
    out = []
    for t in text.split(","):
        m = re.fullmatch(r"([0-9]+)x([0-9]+)", t.strip())
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            sys.exit("--tiles: expected TMxTN, e.g. 128x128, got %r" % t)
        out.append((int(m.group(1)), int(m.group(2))))
    return dict(sm_count=sm_count, tiles=out, k_multiple=k_multiple, split_k=split_k)


def tiles_name(tiles):
    if not tiles:
        return "off"
    return "%s over %d SMs, K to a multiple of %d, split-K up to %d" % (
        ",".join("%dx%d" % t for t in tiles["tiles"]), tiles["sm_count"], tiles["k_multiple"],
        tiles["split_k"])


def fit_curves(rows, peak, bw, tiles):
    return {tp: fit_gemm([r for r in rows if r["tp"] == tp], peak, bw, tiles)
            for tp in sorted({r["tp"] for r in rows})}


# Tile sets --select-tiles compares, as (tiles, K multiple, split-K): none, one CUTLASS-style
# 128x128 tile, and sets from which the library is assumed to run the one that wastes least
# (smaller tiles for few tokens; with split-K, K cut in slices when the tiles of a narrow
# output leave SMs idle).
TILE_CANDIDATES = [None, ("128x128", 256, 1), ("128x128", 512, 1), ("64x128,128x128", 256, 1),
                   ("64x128,128x128", 512, 1), ("32x128,64x128,128x128", 512, 1),
                   ("64x64,64x128,128x128", 512, 1), ("64x128,128x128,128x256", 512, 1),
                   ("128x128", 256, 4), ("128x128", 256, 8), ("64x128,128x128", 256, 8),
                   ("64x128,128x128", 512, 8)]


def select_tiles(train, peak, bw, sm_count, max_tokens):
    """Leave-one-model-out error of the linear-layer sum for each candidate tile set."""
    models = sorted({r["model"] for r in train})
    if len(models) < 2:
        sys.exit("--select-tiles needs at least two fitted models")
    print("Leave-one-model-out over %s, linear sum, tokens 1..%d:" % (", ".join(models),
                                                                       max_tokens))
    print("| tiles | K multiple | split-K | cells | over 10% | mean abs | worst |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for cand in TILE_CANDIDATES:
        tiles = parse_tiles(cand[0], cand[1], sm_count, cand[2]) if cand else None
        errs = []
        for left in models:
            rest = [r for r in train if r["model"] != left]
            mine = [r for r in train if r["model"] == left]
            curves = fit_curves(rest, peak, bw, tiles)
            errs += score(mine, curves, [], peak, bw, max_tokens, tiles)["linear (sum of 4)"]
        print("| %s | %s | %s | %d | %d | %.1f%% | %+.1f%% |" % (
            cand[0] if cand else "none", cand[1] if cand else "—", cand[2] if cand else "—",
            len(errs),
            sum(abs(e[0]) > 0.1 for e in errs), 100 * sum(abs(e[0]) for e in errs) / len(errs),
            100 * max((e[0] for e in errs), key=abs)), flush=True)


def small_elements(row, width):
    x = row["tokens"] * row["hidden"]
    return x / row["tp"] if width == "hidden_per_tp" else x


def fit_small(rows):
    out = []
    for op, width, per in SMALL_OPS:
        xs, ys = [], []
        for r in rows:
            if op in r["times"]:
                xs.append(small_elements(r, width))
                ys.append(r["times"][op])
        a, b = weighted_line(xs, ys)
        out.append(dict(op=op, width=width, per=per, launch_us=round(max(a, 0.0) * 1e6, 3),
                        ns_per_kilo_element=round(b * 1e12, 5)))
    return out


def predict_small(entry, row):
    return entry["launch_us"] * 1e-6 + entry["ns_per_kilo_element"] * 1e-12 * small_elements(
        row, entry["width"])


def read_all_reduce(profiles, gpu):
    path = os.path.join(profiles, "network", gpu + "_dgx", "all_reduce.csv")
    table = {}
    if not os.path.exists(path):
        return table
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["collective"] != "all_reduce" or r["rank"] != "0":
                continue
            if r["devices_per_node"] != r["num_workers"]:
                continue  # one node only: TP runs inside a node
            table.setdefault(int(r["num_workers"]), []).append(
                (int(r["size"]), float(r["time_stats.all_reduce.median"]) * 1e-3))
    return {tp: sorted(v) for tp, v in table.items()}


def monotone(points):
    """Pool-adjacent-violators fit: the least-squares non-decreasing times over size. A
    collective never gets faster with more bytes; single medians at small sizes do (noise)."""
    blocks = []  # [sum, count]
    for _, t in points:
        blocks.append([t, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s_, c = blocks.pop()
            blocks[-1][0] += s_
            blocks[-1][1] += c
    out = []
    for s_, c in blocks:
        out += [s_ / c] * c
    return [(p[0], t) for p, t in zip(points, out)]


def trim_all_reduce(points):
    """Sizes closest to 2^k and 1.5 * 2^k, k = 11 .. 26."""
    keep = []
    for k in range(11, 27):
        for target in (2 ** k, 3 * 2 ** (k - 1)):
            best = min(points, key=lambda p: abs(p[0] - target))
            if best not in keep:
                keep.append(best)
    return sorted(keep)


def interp_all_reduce(points, size):
    xs = [p[0] for p in points]
    if size <= xs[0]:
        return points[0][1]
    if size >= xs[-1]:
        return points[-1][1] * size / xs[-1]
    i = bisect.bisect_right(xs, size) - 1
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    f = (math.log(size) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


def trim(profiles, out_dir):
    """Writes the trimmed copy of a Vidur profile tree (medians, TRIM_TOKENS rows)."""
    for path in sorted(glob.glob(os.path.join(profiles, "compute", "*", "*", "*", "mlp.csv"))):
        rel = os.path.relpath(path, profiles)
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            cols = [c for c in reader.fieldnames if c.endswith(".median")] + TRIM_COLUMNS_TAIL
            kept = [r for r in reader if int(r["num_tokens"]) <= TRIM_ALL_UP_TO or
                    int(r["num_tokens"]) in TRIM_TOKENS]
        os.makedirs(os.path.dirname(os.path.join(out_dir, rel)), exist_ok=True)
        with open(os.path.join(out_dir, rel), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(cols)
            for r in kept:
                w.writerow([r[c] for c in cols])
    for gpu_dir in sorted(glob.glob(os.path.join(profiles, "network", "*_dgx"))):
        gpu = os.path.basename(gpu_dir)[: -len("_dgx")]
        rel = os.path.join("network", gpu + "_dgx", "all_reduce.csv")
        os.makedirs(os.path.dirname(os.path.join(out_dir, rel)), exist_ok=True)
        with open(os.path.join(out_dir, rel), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["time_stats.all_reduce.median", "rank", "num_workers", "size",
                        "collective", "devices_per_node"])
            for tp, points in sorted(read_all_reduce(profiles, gpu).items()):
                for size, t in trim_all_reduce(points):
                    w.writerow([repr(round(t * 1e3, 6)), 0, tp, size, "all_reduce", tp])


def score(rows, curves, small, peak, bw, max_tokens, tiles):
    """Held-out relative errors: {op: [(err, model, tp, tokens, pred, meas)]}."""
    errs = {}
    for r in rows:
        if r["tokens"] > max_tokens or r["tp"] not in curves:
            continue
        total_p = total_m = 0.0
        for op, (k, n) in gemm_shapes(r).items():
            if op not in r["times"]:
                continue
            p = predict_linear(curves[r["tp"]], k, n, r["tokens"], peak, bw, tiles)
            m = r["times"][op]
            total_p += p
            total_m += m
            errs.setdefault(op, []).append((p / m - 1, r["model"], r["tp"], r["tokens"], p, m))
        errs.setdefault("linear (sum of 4)", []).append(
            (total_p / total_m - 1, r["model"], r["tp"], r["tokens"], total_p, total_m))
        for e in small:
            if e["op"] in r["times"]:
                p, m = predict_small(e, r), r["times"][e["op"]]
                errs.setdefault(e["op"], []).append((p / m - 1, r["model"], r["tp"],
                                                     r["tokens"], p, m))
    return errs


def linear_sums(rows, max_tokens):
    """{(model, tp): {tokens: measured seconds of the four linear ops of one layer}}."""
    out = {}
    for r in rows:
        if r["tokens"] <= max_tokens and all(op in r["times"] for op in LINEAR_OPS):
            out.setdefault((r["model"], r["tp"]), {})[r["tokens"]] = sum(
                r["times"][op] for op in LINEAR_OPS)
    return out


def monotone_bound(series):
    """The smallest worst-cell error |p / y - 1| any predictor p that never falls as tokens
    grow can reach on `series` {tokens: y}, and the cells that force it: for an earlier y_i
    above a later y_j the best is p_i = p_j = 2 / (1 / y_i + 1 / y_j), off by
    (y_i - y_j) / (y_i + y_j) at both."""
    best, pair, top = 0.0, None, None
    for t in sorted(series):
        y = series[t]
        if top is None or y > series[top]:
            top = t
        b = (series[top] - y) / (series[top] + y)
        if b > best:
            best, pair = b, (top, t)
    return best, pair


def print_monotone_bounds(rows, held, max_tokens):
    sums = linear_sums(rows, max_tokens)
    print("Measured linear sum per layer (4 GEMMs), tokens 1..%d: where it falls as tokens grow, "
          "a model whose time never falls with more tokens misses one cell by at least:"
          % max_tokens)
    print("| model | set | tp | bound | cells (tokens: measured us) | same tokens, fitted models "
          "at this tp |")
    print("|---|---|---:|---:|---|---|")
    for (model, tp), series in sorted(sums.items()):
        b, pair = monotone_bound(series)
        if pair is None:
            continue
        t0, t1 = pair
        others = []
        for (m2, tp2), s2 in sorted(sums.items()):
            if tp2 == tp and m2 != model and m2 not in held and t0 in s2 and t1 in s2:
                others.append("%s %+.0f%%" % (m2, 100 * (s2[t1] / s2[t0] - 1)))
        print("| %s | %s | %d | %.1f%% | %d: %.0f -> %d: %.0f (%+.0f%%) | %s |" % (
            model, "held out" if model in held else "fit", tp, 100 * b, t0,
            series[t0] * 1e6, t1, series[t1] * 1e6, 100 * (series[t1] / series[t0] - 1),
            ", ".join(others) or "—"))


def splice(hardware_path, calibration):
    """Replaces (or appends) the "calibration" object of a hardware JSON file in place,
    leaving the rest of its text as written."""
    with open(hardware_path) as f:
        text = f.read()
    json.loads(text)  # must be valid before and after
    cut = text.find(',\n  "calibration":')
    body = text[:cut] if cut >= 0 else text.rstrip()[:-1].rstrip()
    block = json.dumps(calibration, indent=2).replace("\n", "\n  ")
    # Numeric arrays on one line each keep the file readable.
    block = re.sub(r"\[\s*(-?[0-9][0-9.e+-]*(?:,\s*-?[0-9][0-9.e+-]*)*)\s*\]",
                   lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                   block)
    new = body + ',\n  "calibration": ' + block + "\n}\n"
    json.loads(new)
    with open(hardware_path, "w") as f:
        f.write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", required=True, help="profile tree (Vidur layout)")
    ap.add_argument("--gpu", help="profile GPU folder name, e.g. a100")
    ap.add_argument("--hardware", help="kvpage hardware JSON (datasheet peaks; --write target)")
    ap.add_argument("--hold-out", default="", help="comma-separated model folders to score")
    ap.add_argument("--all-reduce-from", help="network folder prefix when it differs from --gpu")
    ap.add_argument("--max-tokens", type=int, default=8192, help="largest step scored")
    ap.add_argument("--tiles", metavar="TMxTN,...",
                    help="model tile quantization with these output tiles, e.g. 64x128,128x128")
    ap.add_argument("--k-multiple", type=int, default=1, help="K is rounded up to this (--tiles)")
    ap.add_argument("--sm-count", type=int, help="streaming multiprocessors (with --tiles)")
    ap.add_argument("--split-k", type=int, default=1,
                    help="let a GEMM cut K into up to this many slices (--tiles)")
    ap.add_argument("--select-tiles", action="store_true",
                    help="score the candidate tile sets (TILE_CANDIDATES) by leaving each fitted "
                         "model out in turn (needs --sm-count), and stop")
    ap.add_argument("--write", action="store_true", help="splice the fit into --hardware")
    ap.add_argument("--table", metavar="TOKENS",
                    help="also print predicted vs measured linear time per layer at these "
                         "comma-separated token counts, every model, tp 1")
    ap.add_argument("--trim", metavar="OUT_DIR", help="write a trimmed copy of --profiles")
    ap.add_argument("--monotone-bound", action="store_true",
                    help="print, per model and tp, the least worst-cell error of any model whose "
                         "linear time never falls as tokens grow, and stop")
    args = ap.parse_args()
    if args.trim:
        trim(args.profiles, args.trim)
        return 0
    if not args.gpu or not args.hardware:
        ap.error("--gpu and --hardware are required unless --trim")
    with open(args.hardware) as f:
        hw = json.load(f)
    peak, bw = float(hw["peak_dense_flops"]["bf16"]), float(hw["hbm_bandwidth_bytes_per_s"])
    held = {m for m in args.hold_out.split(",") if m}
    if args.split_k != 1 and not args.tiles:
        ap.error("--split-k %d needs --tiles" % args.split_k)
    tiles = (parse_tiles(args.tiles, args.k_multiple, args.sm_count, args.split_k)
             if args.tiles else None)
    rows = read_compute(args.profiles, args.gpu)
    if not rows:
        sys.exit("no compute profiles under %s/compute/%s" % (args.profiles, args.gpu))
    if args.monotone_bound:
        print_monotone_bounds(rows, held, args.max_tokens)
        return 0
    train = [r for r in rows if r["model"] not in held]
    test = [r for r in rows if r["model"] in held]
    if args.select_tiles:
        if not args.sm_count:
            ap.error("--select-tiles needs --sm-count")
        select_tiles(train, peak, bw, args.sm_count, args.max_tokens)
        return 0
    curves = fit_curves(train, peak, bw, tiles)
    small = fit_small(train)
    ar = read_all_reduce(args.profiles, args.all_reduce_from or args.gpu)
    ar_out = [dict(tp=tp, bytes=[p[0] for p in monotone(trim_all_reduce(pts))],
                   us=[round(p[1] * 1e6, 2) for p in monotone(trim_all_reduce(pts))])
              for tp, pts in sorted(ar.items())]

    models = sorted({r["model"] for r in rows})
    print("GPU %s: trained on %s; held out %s; tile quantization %s" % (args.gpu, ", ".join(
        m for m in models if m not in held), ", ".join(sorted(held)) or "none",
        tiles_name(tiles)))
    for tp, c in curves.items():
        print("  tp %d: GEMM launch %.2f us, weight-read efficiency %.3f, efficiency %s" % (
            tp, c["launch_us"], c["hbm_efficiency"], " ".join(
                "%d:%.2f" % (m, e) for m, e in zip(c["tokens"], c["efficiency"]) if m in (
                    1, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768))))
    if test:
        errs = score(test, curves, small, peak, bw, args.max_tokens, tiles)
        print("\nHeld-out error, predicted / measured median - 1, tokens 1..%d:" % args.max_tokens)
        print("| operation | cells | over 10% | mean abs | worst | worst cell (model, tp, tokens: "
              "pred / meas us) |")
        print("|---|---:|---:|---:|---:|---|")
        for op in ["linear (sum of 4)"] + LINEAR_OPS + [s[0] for s in SMALL_OPS]:
            if op not in errs:
                continue
            e = errs[op]
            w = max(e, key=lambda x: abs(x[0]))
            print("| %s | %d | %d | %.1f%% | %+.1f%% | %s, tp %d, %d: %.1f / %.1f |" % (
                op, len(e), sum(abs(x[0]) > 0.1 for x in e),
                100 * sum(abs(x[0]) for x in e) / len(e), 100 * w[0], w[1], w[2], w[3],
                w[4] * 1e6, w[5] * 1e6))
    if args.table:
        counts = [int(x) for x in args.table.split(",")]
        print("\nLinear layers of one decoder layer, tp 1, predicted / measured median (us):")
        print("| model | set | " + " | ".join("%d tok" % m for m in counts) + " |")
        print("|---|---|" + "---:|" * len(counts))
        for model in models:
            cells = []
            for m in counts:
                r = next((x for x in rows if x["model"] == model and x["tp"] == 1 and
                          x["tokens"] == m), None)
                if r is None or 1 not in curves:
                    cells.append("—")
                    continue
                p = sum(predict_linear(curves[1], k, n, m, peak, bw, tiles)
                        for op, (k, n) in gemm_shapes(r).items() if op in r["times"])
                t = sum(r["times"][op] for op in LINEAR_OPS if op in r["times"])
                cells.append("%.0f / %.0f (%+.0f%%)" % (p * 1e6, t * 1e6, 100 * (p / t - 1)))
            print("| %s | %s | %s |" % (model, "held out" if model in held else "fit",
                                        " | ".join(cells)))
    # Interpolation check of the all-reduce table on the sizes it leaves out.
    for tp, pts in sorted(ar.items()):
        kept = monotone(trim_all_reduce(pts))
        sizes = {p[0] for p in kept}
        rest = [p for p in pts if p[0] not in sizes and kept[0][0] <= p[0] <= kept[-1][0]]
        if rest:
            e = [interp_all_reduce(kept, s) / t - 1 for s, t in rest]
            print("all-reduce tp %d: %d table sizes; %d left-out sizes, mean abs %.1f%%, "
                  "worst %+.1f%%" % (tp, len(kept), len(rest),
                                      100 * sum(map(abs, e)) / len(e), 100 * max(e, key=abs)))

    if args.write:
        cal = {
            "profiles": "%s: compute/%s (models %s), network/%s_dgx/all_reduce.csv" % (
                os.path.normpath(args.profiles), args.gpu,
                ", ".join(m for m in models if m not in held), args.all_reduce_from or args.gpu),
            "held_out": sorted(held),
            "fit_command": " ".join(["python3", "scripts/fit_cost_model.py"] + sys.argv[1:]),
            "gemm": [dict(tp=tp, **c) for tp, c in curves.items()],
            "tiles": tiles and dict(sm_count=tiles["sm_count"],
                                    tiles=[list(t) for t in tiles["tiles"]],
                                    k_multiple=tiles["k_multiple"], split_k=tiles["split_k"]),
            "small_ops": small,
            "all_reduce": ar_out,
        }
        old = hw.get("calibration", {})
        for key in ("attention", "notes"):  # hand-set, kept across refits
            if key in old:
                cal[key] = old[key]
        splice(args.hardware, cal)
        print("wrote calibration to %s" % args.hardware)
    return 0


if __name__ == "__main__":
    sys.exit(main())
