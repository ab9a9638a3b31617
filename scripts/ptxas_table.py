#!/usr/bin/env python3
"""Turns `ptxas -v` output (on stdin) into a table: one row per kernel and target with its
registers, shared memory, stack, spill bytes and resident CTAs per SM on sm_90.

    nvcc ... -Xptxas -v 2>&1 | python3 scripts/ptxas_table.py

CTAs per SM use the same arithmetic as Sm90CtasPerSm (src/kernels_ref/kernel_layout.cc) with
each kernel's CTA size (the k*Threads constants in kernels/*_kernel.cuh).
"""
import re
import subprocess
import sys

THREADS = {"PagedDecodeKernel": 128, "PagedDecodeMlaKernel": 128, "WriteKvKernel": 128,
           "WriteKvFp8Kernel": 128, "MergeKernel": 128, "CopySlotsKernel": 256,
           "ZeroSlotsKernel": 256, "PagedPrefillTiledKernel": 128, "PrefillWorkListKernel": 1024,
           "PrefillRowsKernel": 256}


def threads_of(name):
    """CTA size of a kernel from its name: the k*Threads constants, 32 * 256 / D for the
    tensor-core decode (MmaDecodeThreads)."""
    base = re.sub(r"<.*", "", name)
    if base == "PagedDecodeMmaKernel":
        head_dim = int(re.search(r"<[^,]+, (\d+)>", name).group(1))
        return 32 * (256 // head_dim)
    return THREADS.get(base)


def ctas_per_sm(regs, threads, smem):
    if regs > 255 or threads > 1024 or smem > 232448:
        return 0
    warps = (threads + 31) // 32
    warp_regs = (max(regs, 1) * 32 + 255) // 256 * 256
    shared = (smem + 1024 + 127) // 128 * 128
    return min(65536 // warp_regs // warps, 64 // warps, 233472 // shared, 32)


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        return out if len(out) == len(names) else names
    except (OSError, subprocess.CalledProcessError):
        return names


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"kvpage::cuda::(internal::)?|\(anonymous namespace\)::", "", name)
    name = name.replace("__nv_bfloat16", "bf16").replace("__half", "f16")
    return re.sub(r"\(.*\)$", "", name)


def main():
    rows, cur = [], None
    for line in sys.stdin:
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+a?)'", line)
        if m:
            cur = {"mangled": m.group(1), "arch": m.group(2), "stack": 0, "spill_st": 0,
                   "spill_ld": 0, "regs": 0, "smem": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    names = demangle([r["mangled"] for r in rows])
    print(f"{'kernel':<58} {'arch':<6} {'regs':>4} {'smem':>6} {'stack':>5} {'spill':>5} "
          f"{'CTAs/SM':>7}")
    seen = set()
    for r, name in sorted(zip(rows, names), key=lambda x: short(x[1])):
        key = (short(name), r["arch"])
        if key in seen:
            continue
        seen.add(key)
        threads = threads_of(key[0])
        ctas = ctas_per_sm(r["regs"], threads, r["smem"]) if threads else "-"
        print(f"{key[0]:<58} {r['arch']:<6} {r['regs']:>4} {r['smem']:>6} {r['stack']:>5} "
              f"{r['spill_st'] + r['spill_ld']:>5} {ctas:>7}")


if __name__ == "__main__":
    main()
