"""GPU quantize vs the CPU fp8lab.quantize, bit for bit (run on the GPU machine).

    PYTHONPATH=. python3 benchmarks/gpu_quantize.py [--cast-transpose]

--cast-transpose: only fp8lab.gpu.quantize.cast_transpose (checked bit for bit against the CPU
quantize with the same scale, its transpose and maximum; timed against quantize + transpose and
against torch's scaled cast to float8_e4m3fn and its transpose, side by side).
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
        flat[7] = -np.nan   # sign bit set: its code is the negative NaN where the format has one
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
    # float32 subnormal input (all below 2^-126): each code needs the input's own bits, which a
    # kernel built to flush subnormals reads as zeros; scales computed (themselves subnormal) or given
    for fmt in FORMATS:
        x = (rng.standard_normal((257, 130)) * 2.0**-133).astype(np.float32)
        for kw in (dict(scaling="tensor"), dict(scaling="block:32"),
                   dict(scaling="tensor", scales=np.float32([[2.0**-140]]))):
            for rounding, seed in ((None, None), ("toward_zero", None), ("stochastic", 7)):
                ref = fp8lab.quantize(x, fmt, rounding=rounding, seed=seed, **kw)
                dc, ds = _differences(quantize(cp.asarray(x), fmt, rounding=rounding, seed=seed, **kw), ref)
                n += 1
                if dc or ds:
                    bad += 1
                    log(f"MISMATCH subnormal {fmt} {kw.get('scaling')} given={'scales' in kw} {rounding}: "
                        f"codes {dc}, scales {ds}")
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


CT_SHAPES = ((1, 1), (63, 65), (130, 67), (256, 512), (300, 1028), (17, 4096))


def check_cast_transpose(log, shapes=CT_SHAPES):
    """cast_transpose vs fp8lab.quantize(x, fmt, scales=s) on the CPU: codes, transposed codes and
    the maximum, for every format, deterministic rounding mode and saturation, float32 and float16
    input, contiguous and strided rows, host and device scales (one below 2^-60); running maxima."""
    import cupy as cp
    import fp8lab
    from fp8lab.gpu.quantize import cast_transpose
    rng = np.random.default_rng(7)
    warnings.simplefilter("ignore", RuntimeWarning)
    n = bad = 0

    def compare(tag, x_host, got, s, fmt, **kw):
        nonlocal n, bad
        ref = fp8lab.quantize(x_host, fmt, scaling="tensor", scales=np.float32(s).reshape(1, 1), **kw).codes
        xf = x_host.astype(np.float32)
        fin = np.isfinite(xf)
        amax = np.float32(np.abs(np.where(fin, xf, 0)).max()) if xf.size else np.float32(0)
        dc = int((got.q.codes.get() != ref).sum())
        dt = int((got.t.get() != ref.T).sum()) if got.t is not None else 0
        da = int(got.amax.get()[0].view(np.uint32) != amax.view(np.uint32))
        n += 1
        if dc or dt or da:
            bad += 1
            log(f"MISMATCH cast_transpose {tag} {fmt} {kw}: codes {dc}, transposed {dt}, amax {da}")

    for shape in shapes:
        for dtype in (np.float32, np.float16):
            x = _input(rng, shape, dtype)
            xd = cp.asarray(x)
            for fmt in FORMATS:
                for rounding in ("nearest_even", "nearest_away", "toward_zero"):
                    for sat in (False, True):
                        kw = dict(rounding=rounding, saturate=sat)
                        for s in (np.float32(0.75), np.float32(2.0**-10 * 1.7)):
                            got = cast_transpose(xd, fmt, float(s), **kw)
                            compare(f"{shape} {np.dtype(dtype).name} s={s}", x, got, s, fmt, **kw)
        log(f"cast_transpose check: shape {shape} ({n} cases so far, {bad} with mismatches)")
    # strided rows, a device scale, no transpose, a tiny scale (float64 route), a running maximum
    big = _input(rng, (200, 300), np.float32)
    for fmt in FORMATS:
        sub = big[:, 5:261]
        got = cast_transpose(cp.asarray(big)[:, 5:261], fmt, cp.full(1, 0.5, cp.float32))
        compare("strided", np.ascontiguousarray(sub), got, np.float32(0.5), fmt)
        tiny = sub * np.float32(2.0**-75)
        s = np.float32(2.0**-70 * 1.3)
        got = cast_transpose(cp.asarray(tiny), fmt, cp.full(1, s, cp.float32), transpose=False)
        compare("tiny scale", tiny, got, s, fmt)
    amax = cp.zeros(1, cp.float32)
    a = np.float32([[3.0, -7.5], [np.inf, 1.0]])
    cast_transpose(cp.asarray(a), "e4m3", 1.0, amax=amax)
    cast_transpose(cp.asarray(a * np.float32(0.5)), "e4m3", 1.0, amax=amax)
    first = float(amax.get()[0])
    cast_transpose(cp.asarray(a * np.float32(2.0)), "e4m3", 1.0, amax=amax)
    n += 1
    if (first, float(amax.get()[0])) != (7.5, 15.0):
        bad += 1
        log(f"MISMATCH running amax: {first}, {float(amax.get()[0])} (expected 7.5, 15.0)")
    log(f"cast_transpose check: {n} cases, {bad} with mismatches")
    return bad


def check_random(log, n=1 << 22, nscales=48):
    """cast_transpose against quantize's kernel with given scales (itself checked against the
    CPU), on the device and at scale: ``nscales`` random scales (exponents -70..127, random
    mantissas) x ``n`` inputs, half of them random float32 bit patterns (subnormals, Inf, NaN,
    every exponent), half near the scale (|x / s| in 2^-30..2^20, where codes are not all 0 or
    saturated), plus |x| around 2^-100 and x / s around 2^126; e4m3 (hardware conversion), e5m2
    toward zero and hif8 (tables), saturating and not."""
    import cupy as cp
    from fp8lab.gpu.quantize import cast_transpose, quantize
    rng = np.random.default_rng(11)
    bad = cases = 0
    for i in range(nscales):
        e = int(rng.integers(-70, 128)) if i else 0
        sv = np.float32(np.ldexp(rng.uniform(1, 2), e))
        if not np.isfinite(sv):
            sv = np.float32(2.0**127)
        half = n // 2
        bits = rng.integers(0, 2**32, half, dtype=np.uint64).astype(np.uint32)
        near = (rng.uniform(1, 2, half) * np.exp2(rng.integers(-30, 21, half)) * float(sv)
                * rng.choice([-1.0, 1.0], half)).astype(np.float32)
        edges = np.float32([2.0**-100, np.nextafter(np.float32(2.0**-100), np.float32(0)), 0.0, -0.0,
                            float(sv) * 2.0**126, float(sv) * 2.0**125.99, -float(sv) * 2.0**126.01])
        x = np.concatenate([bits.view(np.float32), near, edges[np.isfinite(edges)]]).astype(np.float32)
        x = x[: (x.size // 64) * 64].reshape(64, -1)
        xd = cp.asarray(x)
        with np.errstate(all="ignore"):
            for fmt, rounding in (("e4m3", None), ("e5m2", "toward_zero"), ("hif8", None)):
                for sat in (False, True):
                    a = cast_transpose(xd, fmt, float(sv), rounding=rounding, saturate=sat, transpose=False)
                    b = quantize(xd, fmt, scaling="tensor", scales=np.float32([[sv]]), rounding=rounding,
                                 saturate=sat)
                    d = int(cp.count_nonzero(a.q.codes != b.codes))
                    cases += 1
                    if d:
                        bad += 1
                        log(f"MISMATCH random inputs: scale {sv!r} {fmt} {rounding} sat={sat}: {d} codes")
    log(f"cast_transpose random-input check: {cases} cases of {x.size} inputs, {bad} with mismatches")
    return bad


def bench_cast_transpose(log, shapes=((8192, 3456), (8192, 1024), (8192, 8192)), grids=(8, 0, 4, 16)):
    """Time cast_transpose against torch's scaled cast to float8_e4m3fn + .t().contiguous() (the
    reference for a cast and transpose) and torch's cast to bfloat16 (what a bf16 step pays);
    also cast_transpose without the transpose, quantize (current scaling: a maximum pass first)
    + fp8lab.gpu.gemm.transpose, and cast_transpose's grid (fp8lab.gpu.quantize.CT_BLOCKS_PER_SM,
    first = default). Per call: ten calls back to back between CUDA events, median of 20."""
    import cupy as cp
    import fp8lab.gpu.quantize as Q
    from fp8lab.gpu.gemm import transpose
    try:
        import torch
    except ImportError:
        torch = None
    default = Q.CT_BLOCKS_PER_SM
    log(f"{'R x C':>12} " + " ".join(f"{f'ct g={g}':>9}" for g in grids)
        + f" {'no tr':>8} {'q+tr':>8} {'torch':>8} {'bf16':>8}   (ms per call; torch / ct, bf16 / ct)")
    for R, C in shapes:
        x = cp.random.standard_normal((R, C), dtype=cp.float32)
        s = cp.full(1, 4.0 / 448, cp.float32)
        amax = cp.zeros(1, cp.float32)
        t_ct = []
        for g in grids:
            Q.CT_BLOCKS_PER_SM = g
            t_ct.append(_time(cp, lambda: Q.cast_transpose(x, "e4m3", s, amax=amax, check=False)))
        Q.CT_BLOCKS_PER_SM = default
        t_c = _time(cp, lambda: Q.cast_transpose(x, "e4m3", s, amax=amax, check=False, transpose=False))
        t_qt = _time(cp, lambda: transpose(Q.quantize(x, "e4m3", scales=np.float32([[4.0 / 448]])).codes))
        t_t = t_b = float("nan")
        if torch is not None:
            xt = torch.as_tensor(x, device="cuda")
            inv = torch.tensor(448 / 4.0, device="cuda")
            t_t = _time(cp, lambda: (xt * inv).to(torch.float8_e4m3fn).t().contiguous())
            t_b = _time(cp, lambda: xt.to(torch.bfloat16))
        log(f"{f'{R}x{C}':>12} " + " ".join(f"{t * 1e3:9.4f}" for t in t_ct)
            + f" {t_c * 1e3:8.4f} {t_qt * 1e3:8.4f} {t_t * 1e3:8.4f} {t_b * 1e3:8.4f}   {t_t / t_ct[0]:5.2f}x "
            f"{t_b / t_ct[0]:5.2f}x; ct {R * C * 6 / t_ct[0] / 1e9:.0f} GB/s")


def _time(cp, fn):
    from gpu_gemm import _timeit
    return _timeit(cp, fn, reps=20, calls=10)

if __name__ == "__main__":
    import fp8lab.gpu
    ok, why = fp8lab.gpu.available()
    print("device:", why)
    if not ok:
        sys.exit(1)
    if "--cast-transpose" in sys.argv[1:]:
        bad = check_cast_transpose(print) + check_random(print)
        bench_cast_transpose(print)
        sys.exit(1 if bad else 0)
    bad = check(print) + check_cast_transpose(print) + check_random(print)
    bench(print)
    bench_cast_transpose(print)
    sys.exit(1 if bad else 0)
