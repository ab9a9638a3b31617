#!/usr/bin/env python3
"""Inner-loop statistics of the decode kernels from `cuobjdump -sass` (on stdin):

    cuobjdump -sass build/kernels-only/CMakeFiles/kvpage_cuda.dir/paged_decode.cu.o \\
      | python3 scripts/sass_loop_stats.py

For every kernel, the main loop is the backward branch whose body loads the most bytes of
K/V: 16-byte loads (LDG.E.128 on the CUDA-core kernel, LDGSTS...128 on the tensor-core one)
and 8-byte ones (LDG.E.64: the CUDA-core kernel on an fp8 cache). Per pass of that loop a
warp reads loads x 32 lanes x their width, times the share of lanes that hold data (10/16,
12/16 and 24/32 for head_dim 80, 96 and 192, whose other lanes idle; 3/4 for the MLA kernel,
whose rope vector only lanes 0-7 load); the table prints the
loop's SASS instructions, that byte count, bytes per warp-instruction and instructions per
KiB, and how many of them are HMMA (mma.sync), LDSM (ldmatrix) and LDGSTS (cp.async). The
tiled prefill kernel's loop is its K/V-tile loop, and the tensor-core MLA kernel's its K-tile
loop; their bytes are one warp's share of the tile.
cuobjdump and nvdisasm are not in the Debian toolkit packages here; the PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry them.
"""
import re
import subprocess
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)")
VEC_LOAD = re.compile(r"\b(LDG\.E\.128|LDG\.E\.[A-Z.]*128|LDGSTS\.[A-Z.]*128)\b")
HALF_LOAD = re.compile(r"\bLDG\.E\.(?:[A-Z]+\.)*64\b")


def kernels(lines):
    name, body = None, []
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = INSTR.search(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2).strip()))
    if name:
        yield name, body


def main_loop(body):
    best = None
    for addr, text in body:
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        inside = [t for a, t in body if target <= a <= addr]
        lane_bytes = sum(16 if VEC_LOAD.search(t) else 8 if HALF_LOAD.search(t) else 0
                         for t in inside)
        if lane_bytes and (best is None or lane_bytes > best[1]):
            best = (len(inside), lane_bytes, opcode_counts(inside))
    return best


def opcode_counts(inside):
    """Tensor-core and async-copy instructions of a loop body: HMMA, LDSM (ldmatrix), LDGSTS
    (cp.async)."""
    return tuple(sum(1 for t in inside if re.match(rf"(@!?U?P\w+\s+)?{op}\b", t))
                 for op in ("HMMA", "LDSM", "LDGSTS"))


def active_lanes(name):
    """Share of the counted loads that carry data: the CUDA-core kernel's lanes per token
    (DecodeLanes); in the MLA kernel only lanes 0-7 load the third (rope) vector, 2.25 of 3."""
    if name.startswith("PagedDecodeMlaKernel"):
        return 0.75
    m = re.search(r"PagedDecodeKernel<[^,]+, (\d+),", name)
    if not m:
        return 1.0
    head_dim = int(m.group(1))
    lanes = 8 if head_dim <= 64 else 16 if head_dim <= 128 else 32
    return head_dim / 8 / lanes


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        return out if len(out) == len(names) else names
    except (OSError, subprocess.CalledProcessError):
        return names


def short(name):
    name = re.sub(r"^void |kvpage::cuda::internal::|\(.*\)$", "", name)
    name = name.replace("__nv_bfloat16", "bf16").replace("__half", "f16")
    return name.replace("Fp8E4m3", "fp8")


def main():
    found = list(kernels(sys.stdin))
    names = demangle([n for n, _ in found])
    print(f"{'kernel':<44} {'loop instr':>10} {'KiB/pass':>8} {'B/warp-instr':>12} "
          f"{'instr/KiB':>9} {'HMMA':>5} {'LDSM':>5} {'LDGSTS':>6}")
    rows = []
    for (mangled, body), name in zip(found, names):
        if "PagedDecode" not in mangled and "PagedPrefill" not in mangled:
            continue
        loop = main_loop(body)
        if loop is None:
            continue
        instrs, lane_bytes, ops = loop
        kib = lane_bytes * 32 * active_lanes(short(name)) / 1024
        rows.append((short(name), instrs, kib, kib * 1024 / instrs, instrs / kib) + ops)
    for r in sorted(rows):
        print(f"{r[0]:<44} {r[1]:>10} {r[2]:>8.1f} {r[3]:>12.1f} {r[4]:>9.1f} "
              f"{r[5]:>5} {r[6]:>5} {r[7]:>6}")


if __name__ == "__main__":
    main()
