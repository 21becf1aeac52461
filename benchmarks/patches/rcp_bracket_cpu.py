"""CPU emulation of rcp-bracket.patch's fast route for scales of the reciprocal path, against
fp8lab.quantize (the reference codes).

    PYTHONPATH=.:benchmarks python3 benchmarks/patches/rcp_bracket_cpu.py [--draws N]

For each scale of gpu_fused.SCALES that takes FP8Q_RCP (not a power of two, in [2^-60, 2^60]):
q = x * (1/s) in float32, the ends lo = q (1 - 2^-21) and hi = q (1 + 2^-21) rounded once to
float32 (the products are exact in float64), their codes by the saturating encoder (the hardware
conversion saturates); where the patch takes its fast route (codes equal, |hi| below
fp8q_fast_lim, x not NaN), those codes must equal fp8lab.quantize(x, scale). Inputs: every
bfloat16 and float16 value, 2^21 random float32 bit patterns. Prints, per case, the share of
elements the fast route takes and how many of its codes are wrong; exit status 1 if any.

``--draws N``: how often the fast route gives up on the fused benchmarks' input instead, N draws
of 2^21 bfloat16 values from N(0, 4) at their delayed scale amax / 448 (e4m3): per draw, the share
of elements whose two ends differ in code, and of 32-element blocks (one thread's block in the
quantize-on-load) and 1024-element groups (about a warp's) holding one. Where amax has few
significant bits, amax / 448 makes many x / s exact midpoints between two codes (a tie that only
the exact quotient decides), and nearly every warp falls back to the careful route.
"""
import argparse
import sys
import warnings

import numpy as np

import fp8lab
from fp8lab.formats import get_format
from fp8lab.gpu.gemm import _cvt_params
from gpu_fused import SCALES, _all16


def codes(x, fmt, sat, s=np.float32(1)):
    return fp8lab.quantize(x.reshape(1, -1), fmt, scaling="tensor", scales=np.float32(s).reshape(1, 1),
                           rounding="nearest_even", saturate=sat).codes.reshape(-1)


def ends(x, s32):
    """The fast route's ends of x / s32: q = x * (1/s) and q (1 -+ 2^-21), each rounded to float32."""
    q = (x * (np.float32(1) / s32)).astype(np.float32).astype(np.float64)
    return (q * (1 - 2.0 ** -21)).astype(np.float32), (q * (1 + 2.0 ** -21)).astype(np.float32)


def draws(n):
    rng = np.random.default_rng(7)
    for _ in range(n):
        x = (rng.standard_normal(1 << 21, dtype=np.float32) * 2).view(np.uint32)
        x = (((x + 0x7FFF + ((x >> 16) & 1)) >> 16) << 16).view(np.float32)   # to bfloat16, nearest even
        amax = np.abs(x).max()
        lo, hi = ends(x, np.float32(amax / np.float32(448)))
        split = codes(lo, "e4m3", True) != codes(hi, "e4m3", True)
        print(f"amax {amax:8.4f}: ends differ for {split.mean():.2e} of elements, "
              f"{split.reshape(-1, 32).any(1).mean():.3f} of 32-blocks, "
              f"{split.reshape(-1, 1024).any(1).mean():.3f} of 1024-groups", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description="CPU emulation of rcp-bracket.patch's fast route")
    ap.add_argument("--draws", type=int, default=0, metavar="N",
                    help="instead: how often the route falls back on N draws of the benchmarks' input")
    a = ap.parse_args()
    if a.draws:
        return draws(a.draws)
    warnings.simplefilter("ignore", RuntimeWarning)
    rng = np.random.default_rng(5)
    inputs = {"bf16": _all16("bfloat16"), "f16": _all16("float16"),
              "rand": rng.integers(0, 1 << 32, 1 << 21, dtype=np.uint64).astype(np.uint32).view(np.float32)}
    wrong = 0
    for s in SCALES:
        s32 = np.float32(s)
        b = int(s32.view(np.uint32))
        if not 0x21800000 <= b <= 0x5D800000 or b & 0x7FFFFF == 0:   # fp8q_make: [2^-60, 2^60], no power of two
            continue
        for name, x in inputs.items():
            lo, hi = ends(x, s32)
            for fmt in ("e4m3", "e5m2"):
                cl, ch = codes(lo, fmt, True), codes(hi, fmt, True)
                for sat in (True, False):
                    lim = min(int(_cvt_params(get_format(fmt), sat)[0]), 0x7F800000)
                    fast = (cl == ch) & ((hi.view(np.uint32) & 0x7FFFFFFF) < lim) & ~np.isnan(x)
                    bad = int((cl[fast] != codes(x, fmt, sat, s32)[fast]).sum())
                    wrong += bad
                    print(f"s={float(s32):<13.6g} {name:4s} {fmt} sat={sat!s:5}: fast route {fast.mean():.6f}, "
                          f"wrong codes {bad}", flush=True)
    print("wrong codes in all:", wrong)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
