"""Multi-GPU benchmark: quantized all-reduce (fp8lab.collectives.nccl) against NCCL's own bf16
all-reduce of the same tensor, for 2..8 GPUs and sizes 1 MB..1 GB, one process per GPU.

    python benchmarks/collectives.py                                  # 2, 4, 8 GPUs as available
    python benchmarks/collectives.py --gpus 2 4 8 --sizes 1M 16M 256M 1G --fmt e4m3 --block 128

``size`` is the bf16 tensor's size in bytes (``n = size / 2`` elements; the quantized collective
reduces the same ``n`` elements given as float32). NVLink multicast is kept off
(``NCCL_NVLS_ENABLE=0``). Before timing, each world size checks that every rank's GPU result
equals, bit for bit, the CPU emulation of the same collective on a small tensor.

Columns: time (median of ``--iters``), algorithm bandwidth ``algbw = 2n / t`` (bf16 bytes of the
tensor) and bus bandwidth ``busbw = algbw * 2 (N - 1) / N`` (the nccl-tests convention) for both
collectives, and the wire bytes the busiest rank sends. Refuses (exit 1) where fewer than two
GPUs, CuPy or NCCL are missing.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"  # before NCCL is loaded anywhere

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    mult = _UNITS.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if t[-1:] in _UNITS else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; e.g. 1M, 64M, 1G") from None


def _check_rank(rank, comm, n, fmt, block, algo, seed):
    """Bit-compare this rank's GPU result with the emulation's (every rank builds the same
    inputs from the seed)."""
    import cupy as cp
    import numpy as np

    from fp8lab.collectives import Compression, emulate, nccl

    world = comm.size()
    xs = np.random.default_rng(seed).standard_normal((world, n)).astype(np.float32)
    out = {}
    for rounding in (None, "stochastic"):
        comp = Compression(fmt, block=block, rounding=rounding, seed=7 if rounding else None)
        gpu = cp.asnumpy(nccl.all_reduce(cp.asarray(xs[rank]), comm, comp, algo=algo))
        cpu = emulate.all_reduce(xs, comp, algo=algo)[rank]
        out[str(rounding)] = bool(np.array_equal(gpu.view(np.uint32), cpu.view(np.uint32)))
    return out


def _time_rank(rank, comm, sizes, fmt, block, algo, iters, warmup):
    import cupy as cp
    import numpy as np

    from fp8lab.collectives import Compression, nccl

    comp = Compression(fmt, block=block)
    rows = []
    for size in sizes:
        n = size // 2
        x32 = cp.random.default_rng(rank).standard_normal(n, dtype=cp.float32)
        xbf = (x32.view(cp.uint32) >> 16).astype(cp.uint16)  # bf16 bits (truncated; timing only)
        res = {}
        for name, fn in (("fp8", lambda: nccl.all_reduce(x32, comm, comp, algo=algo)),
                         ("bf16", lambda: nccl.all_reduce_nccl(xbf, comm))):
            for _ in range(warmup):
                fn()
            cp.cuda.get_current_stream().synchronize()
            times = []
            for _ in range(iters):
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
            res[name] = float(np.median(times))
        rows.append((size, res))
        del x32, xbf
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=None,
                    help="world sizes (default: 2, 4, 8 up to the GPUs present)")
    ap.add_argument("--sizes", type=parse_size, nargs="+",
                    default=[parse_size(s) for s in ("1M", "4M", "16M", "64M", "256M", "1G")])
    ap.add_argument("--fmt", default="e4m3")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--algo", default="ring", choices=["ring", "tree"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)

    from fp8lab.collectives import Compression, analysis, nccl

    try:
        comp = Compression(args.fmt, block=args.block)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ok, why = nccl.available(2)
    if not ok:
        print(f"refusing: this benchmark needs at least 2 GPUs with CuPy and NCCL ({why})",
              file=sys.stderr)
        return 1
    import cupy as cp

    have = cp.cuda.runtime.getDeviceCount()
    worlds = args.gpus or [w for w in (2, 4, 8) if w <= have]
    if max(worlds) > have or min(worlds) < 2:
        print(f"refusing: world sizes {worlds} need 2..{have} GPUs; {have} present", file=sys.stderr)
        return 1
    print(f"# {why}; NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}; {comp}; algo={args.algo}",
          file=sys.stderr)
    print("| GPUs | size (bf16) | fp8 time (ms) | bf16 time (ms) | speed-up | fp8 busbw (GB/s) "
          "| bf16 busbw (GB/s) | fp8 wire MB/rank | bf16 wire MB/rank |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world in worlds:
        checks = nccl.launch(_check_rank, world, 10007, args.fmt, args.block, args.algo, 1)
        if not all(all(c.values()) for c in checks):
            print(f"error: GPU results differ from the emulation on {world} GPUs: {checks}",
                  file=sys.stderr)
            return 1
        print(f"# {world} GPUs: GPU results equal the CPU emulation bit for bit "
              f"(nearest and stochastic)", file=sys.stderr)
        per_rank = nccl.launch(_time_rank, world, args.sizes, args.fmt, args.block, args.algo,
                               args.iters, args.warmup)
        for i, size in enumerate(args.sizes):
            t = {k: max(r[i][1][k] for r in per_rank) for k in ("fp8", "bf16")}  # slowest rank
            n = size // 2
            bus = 2 * (world - 1) / world
            w = analysis.wire_bytes(n, world, comp, "all_reduce", args.algo)
            print(f"| {world} | {size / 2**20:.0f} MiB | {t['fp8'] * 1e3:.3f} | "
                  f"{t['bf16'] * 1e3:.3f} | {t['bf16'] / t['fp8']:.2f} | "
                  f"{2 * n / t['fp8'] * bus / 1e9:.1f} | {2 * n / t['bf16'] * bus / 1e9:.1f} | "
                  f"{w['fp8'] / 2**20:.1f} | {w['bf16'] / 2**20:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
