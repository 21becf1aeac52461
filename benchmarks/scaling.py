"""Scaled quantization and emulated GEMM speed, side by side with NumPy baselines (one table).

    python benchmarks/scaling.py [--repeat 7] [--size 4096] [--gemm 1024]

Rows: per-block(128) quantization of a float32 matrix into E4M3 against a straightforward
NumPy + ml_dtypes pipeline (amax per block, divide, astype float8_e4m3fn); the "fp32" emulated
GEMM against NumPy float32 matmul of the dequantized operands; the "exact" GEMM. Medians of
``--repeat`` runs after one warm-up (compilation excluded). Compare the ratios, measured in one
run, never absolute times across machines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def median_time(fn, repeat: int) -> float:
    fn()  # warm-up: JIT compilation, page faults
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def numpy_block_quantize(x: np.ndarray, block: int = 128):
    import ml_dtypes

    m, k = x.shape
    nb = -(-k // block)
    pad = np.zeros((m, nb * block), np.float32)
    pad[:, :k] = x
    blocks = pad.reshape(m, nb, block)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0))
    codes = (blocks / scale).astype(ml_dtypes.float8_e4m3fn)
    return codes.reshape(m, nb * block)[:, :k], scale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--size", type=int, default=4096, help="quantized matrix is size x size")
    p.add_argument("--gemm", type=int, default=1024, help="GEMM is gemm x gemm x gemm")
    p.add_argument("--exact-repeat", type=int, default=3)
    args = p.parse_args(argv)

    import numba

    import fp8lab
    from fp8lab.gemm import gemm

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.size, args.size)).astype(np.float32)
    rows = []
    t_ours = median_time(lambda: fp8lab.quantize(x, "e4m3", scaling="block:128"), args.repeat)
    t_np = median_time(lambda: numpy_block_quantize(x), args.repeat)
    n = x.size
    rows.append((f"quantize per-block(128) {args.size}x{args.size} -> e4m3", t_ours,
                 "numpy + ml_dtypes pipeline", t_np, t_np / t_ours, ">= 3x faster"))

    G = args.gemm
    a = fp8lab.quantize(rng.standard_normal((G, G)).astype(np.float32), "e4m3", scaling="block:128")
    b = fp8lab.quantize(rng.standard_normal((G, G)).astype(np.float32), "e4m3", scaling="tile:128")
    ad, bd = a.dequantize(), b.dequantize()
    t_fp32 = median_time(lambda: gemm(a, b, accumulate="fp32"), args.repeat)
    t_mm = median_time(lambda: ad @ bd.T, args.repeat)
    rows.append((f'gemm "fp32" {G}^3 (1x128 x 128x128 scales)', t_fp32,
                 "numpy float32 matmul (dequantized)", t_mm, t_mm / t_fp32, "within 4x (>= 0.25)"))
    t_ex = median_time(lambda: gemm(a, b, accumulate="exact"), args.exact_repeat)
    rows.append((f'gemm "exact" {G}^3', t_ex, "numpy float32 matmul (dequantized)", t_mm,
                 t_mm / t_ex, "reported"))

    print(f"# fp8lab {fp8lab.__version__}, numpy {np.__version__}, numba {numba.__version__}, "
          f"{numba.get_num_threads()} threads; medians of {args.repeat} runs")
    print("| fp8lab | median | baseline | median | speed ratio (baseline / fp8lab) | target |")
    print("|---|---|---|---|---|---|")
    for name, t1, base, t2, ratio, target in rows:
        print(f"| {name} | {t1 * 1e3:.1f} ms | {base} | {t2 * 1e3:.1f} ms | {ratio:.2f} | {target} |")
    print(f"quantize throughput: {n / t_ours / 1e9:.2f} Gelem/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
