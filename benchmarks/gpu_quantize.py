"""GPU quantize vs the CPU fp8lab.quantize, bit for bit (run on the GPU machine).

    PYTHONPATH=. python3 benchmarks/gpu_quantize.py
"""

from __future__ import annotations

import sys
import time

import warnings

import numpy as np

RECIPES = ["tensor", "tensor,pow2", "channel", "channel:0", "block", "block:32", "tile", "tile:64,pow2",
           "mx", "mx_up", "block:128,margin=1"]
SHAPES = [(303, 300), (7, 3, 200), (1, 1), (1000,), (2048, 1024)]
FORMATS = ["e4m3", "e5m2", "hif8"]


def _input(rng, shape, dtype):
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(dtype)
    flat = x.reshape(-1)
    if flat.size > 8:
        flat[:: max(1, flat.size // 5)] = 0
        flat[1] = np.inf
        flat[3] = np.nan
        flat[5] = -np.inf
    if x.ndim == 2 and x.shape[0] > 4:
        x[2] = 0  # an all-zero row
    return x


def _differences(got, ref):
    """(codes, scales) that differ between a GPUQTensor and the CPU QTensor (scales bitwise)."""
    dc = int((got.codes.get() != ref.codes).sum())
    ds = int((got.scales.get().view(np.uint32) != ref.scales.view(np.uint32)).sum())
    return dc, ds


ROUNDINGS = ((None, None, False), ("stochastic", 7, False), ("toward_zero", None, True))


def check(log, shapes=SHAPES, roundings=ROUNDINGS):
    import cupy as cp
    import fp8lab
    from fp8lab.gpu.quantize import quantize
    rng = np.random.default_rng(2026)
    warnings.simplefilter("ignore", RuntimeWarning)
    n = bad = 0
    for shape in shapes:
        log(f"quantize check: shape {shape} ({n} cases so far, {bad} with mismatches)")
        for dtype in (np.float32, np.float64, np.float16):
            x = _input(rng, shape, dtype)
            xd = cp.asarray(x)
            for fmt in FORMATS:
                for rec in RECIPES:
                    if rec.startswith("mx") and fmt == "hif8":
                        continue
                    for rounding, seed, sat in roundings:
                        kw = dict(rounding=rounding, seed=seed)
                        if sat:
                            kw["saturate"] = True
                        try:
                            ref = fp8lab.quantize(x, fmt, scaling=rec, **kw)
                        except ValueError:  # recipe not defined for this shape (tile on 1-D)
                            continue
                        dc, ds = _differences(quantize(xd, fmt, scaling=rec, **kw), ref)
                        n += 1
                        if dc or ds:
                            bad += 1
                            log(f"MISMATCH {shape} {np.dtype(dtype).name} {fmt} {rec} {rounding}: codes {dc}, scales {ds}")
    # scales below 2^-60 (the float64 route inside the fused kernel) and scales given by the caller
    for fmt in FORMATS:
        x = _input(rng, (257, 130), np.float32) * np.float32(2.0**-75)
        for kw in (dict(scaling="block:32"), dict(scaling="tensor", scales=np.float32([[2.0**-70 * 1.3]])),
                   dict(scaling="channel", scales=np.float32(rng.uniform(0.5, 3, (257, 1))))):
            for rounding in (None, "toward_zero"):
                ref = fp8lab.quantize(x, fmt, rounding=rounding, **kw)
                dc, ds = _differences(quantize(cp.asarray(x), fmt, rounding=rounding, **kw), ref)
                n += 1
                if dc or ds:
                    bad += 1
                    log(f"MISMATCH tiny/given {fmt} {kw.get('scaling')} {rounding}: codes {dc}, scales {ds}")
    log(f"quantize check: {n} cases, {bad} with mismatches")
    return bad


def bench(log):
    import cupy as cp
    from fp8lab.gpu.quantize import quantize
    x = cp.random.standard_normal((8192, 8192), dtype=cp.float32)
    for rec in ("tensor", "channel", "block", "tile"):
        for _ in range(2):
            quantize(x, "e4m3", scaling=rec)
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            quantize(x, "e4m3", scaling=rec)
        cp.cuda.Device().synchronize()
        t = (time.perf_counter() - t0) / 5
        log(f"quantize 8192x8192 float32 -> e4m3 {rec}: {t * 1e3:.2f} ms, {x.size * 5 / t / 1e9:.0f} GB/s (5 B/elem)")


if __name__ == "__main__":
    import fp8lab.gpu
    ok, why = fp8lab.gpu.available()
    print("device:", why)
    if not ok:
        sys.exit(1)
    bad = check(print)
    bench(print)
    sys.exit(1 if bad else 0)
