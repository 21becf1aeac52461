"""GEMM correctness and speed on the GPU (run on the H200; torch is a baseline only).

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_gemm.py [--check] [--bench] [--small] [--grouped]
                                                 [--variants] [--accuracy]

--check: every format pair x layout x scaling x out dtype on ragged shapes, against a float64
reference of the dequantized operands, elementwise bound from K; fresh random inputs; outputs
poisoned with NaN first. --bench: the issue's shapes; fp8lab vs torch._scaled_mm (cuBLASLt, e4m3
per-tensor) and cuBLAS fp16 (torch.matmul), TFLOPS and ratios, error vs float64. --variants:
the wgmma kernel's variants (VARIANTS: overlapped promotion, TMA-store epilogue, split-K) side by side. --accuracy: error vs
float64 of fp8lab and cuBLASLt with and without fast accumulation on the same e4m3 operands.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

PAIRS = [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2"), ("hif8", "hif8"), ("hif8", "e4m3")]
#: ragged shapes of the wide-tile checks: K = 1000 (whole 4-block rows of block scales), 130, 520
WIDE_SHAPES = ((303, 300, 1000), (129, 257, 130), (1, 1, 1), (300, 264, 520))
SHAPES = [(8192, 8192, 8192), (65536, 1024, 1024), (65536, 4096, 512), (16384, 512, 512),
          (2048, 1024, 1024), (8192, 256, 256)]
OUT_EPS = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# absolute error of rounding into the output type's subnormals (half its smallest subnormal):
# a relative bound alone fails there, e.g. a 1x1x1 float16 product near 1e-5
# (bfloat16 is float32 less its 16 low bits, as _to_f64 reads it: float32's smallest normal times
# 2^-(fraction bits left))
OUT_ABS = {"float32": float(np.finfo(np.float32).smallest_subnormal) / 2,
           "bfloat16": float(np.finfo(np.float32).tiny) * 2.0 ** -(np.finfo(np.float32).nmant - 16) / 2,
           "float16": float(np.finfo(np.float16).smallest_subnormal) / 2}


def _codes(cp, G, shape, fmt):
    x = cp.random.standard_normal(shape, dtype=cp.float32)
    return G.encode(x, fmt, saturate=True)


def _cublaslt(torch, a, b, sa=None, sb=None):
    """cuBLASLt's e4m3 GEMM (``torch._scaled_mm``, bfloat16 out) of the codes ``a`` (M, K) and
    ``b`` (N, K), as a callable: unit scales, or row-wise with float32 scales ``sa`` (M,) and
    ``sb`` (N,) (passed as (M, 1) and (1, N))."""
    ta = torch.from_dlpack(a).view(torch.float8_e4m3fn)
    tb = torch.from_dlpack(b).view(torch.float8_e4m3fn)
    if sa is None:
        ra = rb = torch.ones((), device="cuda", dtype=torch.float32)
    else:
        ra, rb = torch.from_dlpack(sa).reshape(-1, 1), torch.from_dlpack(sb).reshape(1, -1)
    return lambda: torch._scaled_mm(ta, tb.t(), scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)


def _dequant(cp, G, codes, fmt):
    return G.decode(codes, fmt, dtype="float64")


def _expand_scales(cp, scaling, sa, sb, M, N, K):
    """Per-element scale matrices: A (M, K), B as (N, K)."""
    if scaling == "tensor":
        return cp.full((M, K), float(sa[0])), cp.full((N, K), float(sb[0]))
    if scaling == "row_col":
        return cp.repeat(sa.astype(cp.float64)[:, None], K, 1), cp.repeat(sb.astype(cp.float64)[:, None], K, 1)
    SA = cp.repeat(sa.astype(cp.float64), 128, 1)[:, :K]
    SB = cp.repeat(cp.repeat(sb.astype(cp.float64), 128, 0), 128, 1)[:N, :K]
    return SA, SB


def _make_scales(cp, scaling, M, N, K):
    kb, nb = -(-K // 128), -(-N // 128)
    r = lambda *s: cp.exp2(cp.random.randint(-3, 4, s)).astype(cp.float32) * \
        cp.random.uniform(0.5, 1.0, s).astype(cp.float32)
    if scaling == "tensor":
        return r(1), r(1)
    if scaling == "row_col":
        return r(M), r(N)
    return r(M, kb), r(nb, kb)


def _to_f64(cp, c, out_dtype):
    if out_dtype == "bfloat16":
        return (c.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
    return c.astype(cp.float64)


#: extra error allowance per kernel, times sum_k |a_k b_k| (on top of the fp32 (K+2) 2^-24), empirical:
#: FP8 tensor-core accumulation inside one 128-element block is not IEEE fp32 (alignment keeps
#: fewer bits; H200, 2026-12-02: max seen 2^-12.0, so 2^-10 allows 4x); the partial sum is promoted
#: into fp32 every 128 elements. HGMMA (f16) max seen 2^-23.3, inside the fp32 bound.
KERNEL_TOL = {"mma": 0.0, "wgmma-f16": 2.0 ** -22, "wgmma-fp8": 2.0 ** -10}


def run_case(cp, G, gemm, fa, fb, M, N, K, layout, scaling, out_dtype, kernel="auto"):
    a = _codes(cp, G, (M, K), fa)
    bt = _codes(cp, G, (N, K), fb)
    b = bt if layout == "nt" else cp.ascontiguousarray(bt.T)
    sa, sb = _make_scales(cp, scaling, M, N, K)
    odt = cp.uint16 if out_dtype == "bfloat16" else cp.dtype(out_dtype)
    out = cp.empty((M, N), odt)
    out.view(cp.uint16 if out.dtype.itemsize == 2 else cp.uint32)[...] = 0x7FFF if out.dtype.itemsize == 2 else 0x7FC00000
    gemm(a, b, fa, fb, scale_a=sa, scale_b=sb, scaling=scaling, layout=layout, out_dtype=out_dtype, out=out,
         kernel=kernel)
    import fp8lab.gpu.gemm as GM
    ran = GM.last_kernel
    c = _to_f64(cp, out, out_dtype)
    SA, SB = _expand_scales(cp, scaling, sa, sb, M, N, K)
    A64, B64 = _dequant(cp, G, a, fa) * SA, _dequant(cp, G, bt, fb) * SB
    ref = A64 @ B64.T
    absprod = cp.abs(A64) @ cp.abs(B64).T
    bound = (((K + 2) * 2.0 ** -24 + KERNEL_TOL.get(ran, 0.0)) * absprod + OUT_EPS[out_dtype] * cp.abs(ref)
             + OUT_ABS[out_dtype] + 1e-300)
    err = cp.abs(c - ref)
    nan = int(cp.isnan(c).sum())
    over = int((err > bound).sum())
    rel = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
    # accumulation error alone (float32 output only): max |C - ref| / sum |a b|
    acc_err = float(cp.max(err / (absprod + 1e-300))) if out_dtype == "float32" else float("nan")
    return nan, over, rel, ran, acc_err


def check(log, shapes=((303, 300, 1000), (129, 257, 130), (1, 1, 1), (64, 200, 129), (300, 264, 520),
                      (130, 136, 200), (200, 136, 4100)), kernel="auto", pairs=PAIRS, scalings=None,
          each=None):
    """Every case (shape, format pair, layout, scaling, output type) against its float64 bound;
    the number of failing cases. ``scalings``: a subset of the library's (default all); ``each``:
    called with each case's text before it runs (a kernel fault then names its case)."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import LAYOUTS, OUT_DTYPES, SCALINGS, gemm
    bad = 0
    n = 0
    worst: dict = {}
    for (M, N, K) in shapes:
        for fa, fb in pairs:
            for layout in LAYOUTS:
                for scaling in scalings or SCALINGS:
                    for od in OUT_DTYPES:
                        if each is not None:
                            each(f"{M}x{N}x{K} {fa}x{fb} {layout} {scaling} {od}")
                        nan, over, rel, ran, acc = run_case(cp, G, gemm, fa, fb, M, N, K, layout, scaling, od,
                                                            kernel)
                        n += 1
                        if acc == acc:
                            worst[ran] = max(worst.get(ran, 0.0), acc)
                        if nan or over:
                            bad += 1
                            log(f"FAIL {M}x{N}x{K} {fa}x{fb} {layout} {scaling} {od} [{ran}]: nan={nan} "
                                f"over_bound={over} rel={rel:.2e}")
    log(f"gemm check ({kernel}): {n} cases, {bad} failures (shapes {list(shapes)}); max |C-ref|/sum|ab| "
        f"(float32 out) per kernel: " + ", ".join(f"{k} {v:.2e} (2^{np.log2(v) if v else -999:.1f})"
                                                   for k, v in worst.items()))
    return bad


def _timeit(cp, fn, reps=10, calls=1):
    """Median seconds per call of ``fn`` over ``reps`` timings (CUDA events) of ``calls`` calls
    back to back, after warm-up calls."""
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(calls):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / calls)
    return float(np.median(ts))


def bench(log, shapes=SHAPES, kernel="auto"):
    """TFLOPS per shape: e4m3 NT per-tensor (vs cuBLASLt ``_scaled_mm``), e4m3 NT per-row
    (``row_col``: a scale per row of A and per row of B), e4m3 NN (B transposed inside the call)
    and e4m3 block scaling, hif8 NT (vs cuBLAS fp16 ``torch.matmul``), bfloat16 out; every e4m3
    ratio is to cuBLASLt per-tensor, and ``torch row`` is torch's own row-wise ``_scaled_mm`` for
    reference; errors ||C - ref|| / ||ref|| against float64."""
    import cupy as cp
    import torch
    import fp8lab.gpu.codecs as G
    import fp8lab.gpu.gemm as GM
    gemm = GM.gemm
    rows = []
    hdr = (f"{'M x N x K':>20s} {'e4m3 NT':>8s} {'cuBLASLt':>9s} {'ratio':>6s} {'e4m3 row':>8s} {'ratio':>6s} "
           f"{'torch row':>9s} {'e4m3 NN':>8s} {'ratio':>6s} "
           f"{'e4m3 blk':>8s} {'ratio':>6s} {'hif8':>6s} {'cuBLAS f16':>10s} {'ratio':>6s} {'err e4m3':>9s} "
           f"{'err hif8':>9s} {'err cuBLASLt':>12s} kernels")

    def line(r):
        M, N, K = r["shape"]
        return (f"{M:>6d}x{N:>5d}x{K:>5d} {r['e4m3']:8.0f} {r['cublaslt']:9.0f} {r['e4m3'] / r['cublaslt']:6.2f} "
                f"{r['e4m3_row']:8.0f} {r['e4m3_row'] / r['cublaslt']:6.2f} {r['torch_row']:9.0f} "
                f"{r['e4m3_nn']:8.0f} {r['e4m3_nn'] / r['cublaslt']:6.2f} {r['e4m3_blk']:8.0f} "
                f"{r['e4m3_blk'] / r['cublaslt']:6.2f} {r['hif8']:6.0f} {r['cublas_f16']:10.0f} "
                f"{r['hif8'] / r['cublas_f16']:6.2f} {r['err_e4m3']:9.1e} {r['err_hif8']:9.1e} "
                f"{r['err_cublaslt']:12.1e} {r['kernels']}")

    for (M, N, K) in shapes:
        fl = 2.0 * M * N * K
        r = {"shape": (M, N, K)}
        ks = []
        for fmt in ("e4m3", "hif8"):
            a = _codes(cp, G, (M, K), fmt)
            b = _codes(cp, G, (N, K), fmt)
            out = cp.empty((M, N), cp.uint16)
            t = _timeit(cp, lambda: gemm(a, b, fmt, scaling="tensor", out_dtype="bfloat16", out=out, kernel=kernel))
            ks.append(GM.last_kernel)
            r[fmt] = fl / t / 1e12
            c = _to_f64(cp, out, "bfloat16")
            A64, B64 = _dequant(cp, G, a, fmt), _dequant(cp, G, b, fmt)
            ref = A64 @ B64.T
            r[f"err_{fmt}"] = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
            if fmt == "e4m3":
                bn = cp.ascontiguousarray(b.T)
                t = _timeit(cp, lambda: gemm(a, bn, fmt, layout="nn", out_dtype="bfloat16", out=out, kernel=kernel))
                r["e4m3_nn"] = fl / t / 1e12
                sa, sb = _make_scales(cp, "row_col", M, N, K)
                t = _timeit(cp, lambda: gemm(a, b, fmt, scale_a=sa, scale_b=sb, scaling="row_col",
                                             out_dtype="bfloat16", out=out, kernel=kernel))
                r["e4m3_row"] = fl / t / 1e12
                r["torch_row"] = fl / _timeit(cp, _cublaslt(torch, a, b, sa, sb)) / 1e12
                sa, sb = _make_scales(cp, "block", M, N, K)
                t = _timeit(cp, lambda: gemm(a, b, fmt, scale_a=sa, scale_b=sb, scaling="block",
                                             out_dtype="bfloat16", out=out, kernel=kernel))
                r["e4m3_blk"] = fl / t / 1e12
                del bn
                f = _cublaslt(torch, a, b)
                r["cublaslt"] = fl / _timeit(cp, f) / 1e12
                ct = cp.from_dlpack(f().float()).astype(cp.float64)
                r["err_cublaslt"] = float(cp.linalg.norm(ct - ref) / cp.linalg.norm(ref))
            else:
                ha = torch.from_dlpack(A64.astype(cp.float16))
                hb = torch.from_dlpack(B64.astype(cp.float16))
                r["cublas_f16"] = fl / _timeit(cp, lambda: ha @ hb.t()) / 1e12
            del a, b, out, c, A64, B64, ref
            cp.get_default_memory_pool().free_all_blocks()
        r["kernels"] = "/".join(ks)
        rows.append(r)
        log(line(r))
    log(hdr)
    for r in rows:
        log(line(r))
    return rows


_V = {"WGMMA_OVERLAP": True, "TMA_STORE": True, "SPLIT_K": True, "WIDE_TILES": "never", "WIDE_FP8": 192}
VARIANTS = {"v0": {**_V, "WGMMA_OVERLAP": False, "TMA_STORE": False, "SPLIT_K": False},
            "v1": {**_V, "TMA_STORE": False, "SPLIT_K": False},
            "v2": {**_V, "SPLIT_K": False},
            "v3": _V,
            "v4": {**_V, "WIDE_TILES": "always"},
            "v5": {**_V, "WIDE_TILES": "always", "WIDE_FP8": 256}}
#: variants whose outputs must reproduce v0's bit for bit, per case (split-K changes the order of
#: the fp32 sums, and so do the f16 path's wide tiles: their difference is reported instead)
SAME_BITS = {"v1": ("e4m3", "blk", "hif8"), "v2": ("e4m3", "blk", "hif8"), "v4": ("e4m3", "blk"),
             "v5": ("e4m3", "blk")}


def bench_variants(log, shapes=((8192, 8192, 8192), (65536, 1024, 1024), (8192, 3456, 512),
                                 (8192, 512, 3456), (8192, 1024, 3456), (8192, 256, 256),
                                 (512, 3456, 8192), (256, 512, 8192))):
    """Kernel variants side by side with cuBLASLt (flags of fp8lab.gpu.gemm, :data:`VARIANTS`):
    v0 issue-wait-promote with direct stores, v1 overlapped promotion, v2 v1 + TMA-store epilogue,
    v3 v2 + split-K, v4 v3 + wide tiles wherever the kernel has them, v5 v4 with 256-wide FP8 tiles
    (two 128-column halves). e4m3 NT per-tensor and
    block-scaled, hif8 NT; bfloat16 out. The outputs of the :data:`SAME_BITS` variants must be
    bit-identical to v0's; the others are compared by their difference from v0 (max |diff| /
    max |v0|)."""
    import cupy as cp
    import torch
    import fp8lab.gpu.codecs as G
    import fp8lab.gpu.gemm as GM
    names = list(VARIANTS)
    log(f"{'M x N x K':>20s} {'cuBLASLt':>9s} " + " ".join(f"{c + ' ' + v:>9s}" for c in ("e4m3", "blk", "hif8")
                                                         for v in names)
        + "  (TFLOPS)  e4m3/blk ratios to cuBLASLt per-tensor; same bits as v0")
    saved = {k: getattr(GM, k) for k in VARIANTS["v0"]}
    bad = 0
    try:
        for (M, N, K) in shapes:
            fl = 2.0 * M * N * K
            a, b = _codes(cp, G, (M, K), "e4m3"), _codes(cp, G, (N, K), "e4m3")
            lt = fl / _timeit(cp, _cublaslt(torch, a, b)) / 1e12
            sa, sb = _make_scales(cp, "block", M, N, K)
            ha, hb = _codes(cp, G, (M, K), "hif8"), _codes(cp, G, (N, K), "hif8")
            cases = [("e4m3", a, b, "tensor", 1.0, 1.0), ("blk", a, b, "block", sa, sb),
                     ("hif8", ha, hb, "tensor", 1.0, 1.0)]
            row, same = {}, []
            for name, x, y, sc, s1, s2 in cases:
                ref = None
                for v in names:
                    for k, val in VARIANTS[v].items():
                        setattr(GM, k, val)
                    out = cp.empty((M, N), cp.uint16)
                    fmt = "hif8" if name == "hif8" else "e4m3"
                    row[(name, v)] = fl / _timeit(cp, lambda: GM.gemm(
                        x, y, fmt, scale_a=s1, scale_b=s2, scaling=sc, out_dtype="bfloat16",
                        out=out)) / 1e12
                    if ref is None:
                        ref = out
                    elif name in SAME_BITS.get(v, ()):
                        same.append(bool((out == ref).all()))
                    else:
                        f32 = lambda u: (u.astype(cp.uint32) << 16).view(cp.float32)
                        d = float(cp.abs(f32(out) - f32(ref)).max() / cp.abs(f32(ref)).max())
                        row[(name, v, "diff")] = d
                del ref
            bad += same.count(False)
            log(f"{M:>6d}x{N:>5d}x{K:>5d} {lt:9.0f} " + " ".join(
                f"{row[(n, v)]:9.0f}" for n in ("e4m3", "blk", "hif8") for v in names)
                + "  " + " ".join(f"{row[(n, v)] / lt:.3f}" for n in ("e4m3", "blk") for v in names)
                + "  " + " ".join("yes" if x else "NO" for x in same)
                + "  v3-v0 " + " ".join(f"{row[(n, 'v3', 'diff')]:.1e}" for n in ("e4m3", "blk", "hif8"))
                + f"  v4-v0 hif8 {row[('hif8', 'v4', 'diff')]:.1e}")
            del a, b, ha, hb, sa, sb
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        for k, val in saved.items():
            setattr(GM, k, val)
    log(f"variant outputs differing from v0: {bad}")
    return bad


def check_wide(log, shapes=WIDE_SHAPES + ((640, 456, 700),)):
    """Wide CTA tiles (``WIDE_TILES="always"``) against 128-wide ones on the same inputs, NT and NN,
    every scaling and out dtype. FP8 pairs must agree bit for bit (the same
    additions per element); the f16 path accumulates in another order, so its difference is
    reported (and :func:`check` bounds its error against float64). Returns the FP8 differences."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    import fp8lab.gpu.gemm as GM
    saved = GM.WIDE_TILES
    bad = n = 0
    f16_diff = 0.0
    try:
        for (M, N, K) in shapes:
            for fa, fb in PAIRS:
                a, bt = _codes(cp, G, (M, K), fa), _codes(cp, G, (N, K), fb)
                for layout in ("nt", "nn"):
                    b = bt if layout == "nt" else cp.ascontiguousarray(bt.T)
                    for scaling in GM.SCALINGS:
                        sa, sb = _make_scales(cp, scaling, M, N, K)
                        for od in GM.OUT_DTYPES:
                            outs = []
                            for wide in ("never", "always"):
                                GM.WIDE_TILES = wide
                                outs.append(GM.gemm(a, b, fa, fb, scale_a=sa, scale_b=sb, scaling=scaling,
                                                    layout=layout, out_dtype=od))
                            n += 1
                            if GM.last_kernel == "wgmma-fp8":
                                if not bool((outs[0].view(cp.uint8) == outs[1].view(cp.uint8)).all()):
                                    bad += 1
                                    log(f"DIFFER {M}x{N}x{K} {fa}x{fb} {layout} {scaling} {od}")
                            else:
                                x, y = (_to_f64(cp, o, od) for o in outs)
                                den = float(cp.abs(x).max()) or 1.0
                                f16_diff = max(f16_diff, float(cp.abs(x - y).max()) / den)
    finally:
        GM.WIDE_TILES = saved
    log(f"wide tiles vs 128-wide: {n} cases, {bad} FP8 cases differing; f16 path max |diff| / max |C| "
        f"{f16_diff:.1e}")
    return bad


def accuracy(log, M=2048, N=2048, ks=(1024, 8192, 65536)):
    """Error against float64 of the same e4m3 operands (per-tensor scales from fp8lab.gpu.quantize)
    multiplied three ways, float32 out: fp8lab (partials promoted into fp32 every 128 K-elements),
    cuBLASLt ``_scaled_mm`` with ``use_fast_accum=True`` and with ``False``. Inputs: N(0, 1) and
    |N(0, 1)| (all products of one sign: the sums grow with K and accumulation precision shows)."""
    import cupy as cp
    import torch
    from fp8lab.formats import get_format
    from fp8lab.gpu.gemm import gemm
    from fp8lab.gpu.quantize import quantize
    dec = cp.asarray(get_format("e4m3").decode_table("float64"))
    log(f"{'inputs':>8s} {'M x N x K':>20s} {'fp8lab':>10s} {'cuBLASLt':>10s} {'fast acc':>10s}   "
        f"(||C - C64|| / ||C64||, float32 out)  {'max rel fp8lab':>14s} {'cuBLASLt':>9s} {'fast':>9s}")
    rng = cp.random.default_rng(7)
    worse = 0
    for dist in ("normal", "abs"):
        for K in ks:
            xa = rng.standard_normal((M, K), dtype=cp.float32)
            xb = rng.standard_normal((N, K), dtype=cp.float32)
            if dist == "abs":
                xa, xb = cp.abs(xa), cp.abs(xb)
            qa, qb = quantize(xa, "e4m3", saturate=True), quantize(xb, "e4m3", saturate=True)
            del xa, xb
            sa, sb = qa.scales.ravel(), qb.scales.ravel()
            a64 = dec[qa.codes] * sa[0].astype(cp.float64)
            b64 = dec[qb.codes] * sb[0].astype(cp.float64)
            ref = a64 @ b64.T
            del a64, b64
            nref = cp.linalg.norm(ref)
            ours = gemm(qa.codes, qb.codes, "e4m3", scale_a=sa, scale_b=sb, out_dtype="float32")
            ta = torch.from_dlpack(qa.codes).view(torch.float8_e4m3fn)
            tb = torch.from_dlpack(qb.codes).view(torch.float8_e4m3fn)
            tsa, tsb = torch.from_dlpack(sa.reshape(())), torch.from_dlpack(sb.reshape(()))
            res = [ours]
            for fast in (False, True):
                c = torch._scaled_mm(ta, tb.t(), scale_a=tsa, scale_b=tsb, out_dtype=torch.float32,
                                     use_fast_accum=fast)
                res.append(cp.from_dlpack(c))
            errs = [float(cp.linalg.norm(r.astype(cp.float64) - ref) / nref) for r in res]
            den = cp.abs(ref).max()
            mx = [float(cp.abs(r.astype(cp.float64) - ref).max() / den) for r in res]
            worse += errs[0] > errs[1]
            log(f"{dist:>8s} {M:>6d}x{N:>5d}x{K:>5d} {errs[0]:10.2e} {errs[1]:10.2e} {errs[2]:10.2e}   "
                f"{'':37s} {mx[0]:14.2e} {mx[1]:9.2e} {mx[2]:9.2e}")
            del ref, res, ours, qa, qb, ta, tb
            cp.get_default_memory_pool().free_all_blocks()
    log(f"cases where fp8lab's error exceeds cuBLASLt without fast accumulation: {worse}")
    return worse


def run(rng, res, log):
    res["gemm_check_failures"] = check(log)
    res["gemm_bench"] = bench(log)


def check_grouped(log, cases=((5, 130, 200, 300), (3, 256, 128, 256), (2, 1, 1, 1))):
    """gemm_grouped == G separate gemm calls, bit for bit (same kernel and tile arithmetic), for
    every pair x scaling x out dtype; outputs poisoned first."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import gemm, gemm_grouped
    bad = n = 0
    for (g, M, N, K) in cases:
        for fa, fb in PAIRS:
            a = _codes(cp, G, (g, M, K), fa)
            b = _codes(cp, G, (g, N, K), fb)
            for scaling in ("tensor", "row_col", "block"):
                per = [_make_scales(cp, scaling, M, N, K) for _ in range(g)]
                sa = cp.stack([p[0] for p in per])
                sb = cp.stack([p[1] for p in per])
                if scaling == "tensor":
                    sa, sb = sa.reshape(g), sb.reshape(g)
                for out_dtype in ("float32", "bfloat16"):
                    odt = cp.uint16 if out_dtype == "bfloat16" else cp.float32
                    out = cp.full((g, M, N), 0x7FC0 if out_dtype == "bfloat16" else np.nan, odt)
                    gemm_grouped(a, b, fa, fb, scale_a=sa, scale_b=sb, scaling=scaling,
                                 out_dtype=out_dtype, out=out)
                    want = cp.stack([gemm(a[i], b[i], fa, fb, scale_a=per[i][0], scale_b=per[i][1],
                                          scaling=scaling, out_dtype=out_dtype) for i in range(g)])
                    w = out.view(cp.uint16 if out_dtype == "bfloat16" else cp.uint32)
                    v = want.view(cp.uint16 if out_dtype == "bfloat16" else cp.uint32)
                    d = int((w != v).sum())
                    n += 1
                    if d:
                        bad += 1
                        log(f"GROUPED MISMATCH G={g} {M}x{N}x{K} {fa}x{fb} {scaling} {out_dtype}: {d}")
    log(f"grouped check: {n} cases, {bad} with differences from separate calls")
    return bad


def bench_grouped(log, g=64, shape=(8192, 256, 256)):
    """g GEMMs of one shape, e4m3 per-tensor, bfloat16 out: one gemm_grouped launch against g
    torch._scaled_mm (cuBLASLt) calls and g fp8lab gemm calls."""
    import cupy as cp
    import torch
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import gemm, gemm_grouped
    M, N, K = shape
    a = _codes(cp, G, (g, M, K), "e4m3")
    b = _codes(cp, G, (g, N, K), "e4m3")
    sa = cp.ones(g, cp.float32)
    sb = cp.ones(g, cp.float32)
    out = cp.empty((g, M, N), cp.uint16)
    t_grouped = _timeit(cp, lambda: gemm_grouped(a, b, "e4m3", scale_a=sa, scale_b=sb,
                                                 out_dtype="bfloat16", out=out))
    t_calls = _timeit(cp, lambda: [gemm(a[i], b[i], "e4m3", scale_a=sa[i:i + 1], scale_b=sb[i:i + 1],
                                        out_dtype="bfloat16", out=out[i]) for i in range(g)])
    ta = [torch.from_dlpack(a[i]).view(torch.float8_e4m3fn) for i in range(g)]
    tb = [torch.from_dlpack(b[i]).view(torch.float8_e4m3fn) for i in range(g)]
    one = torch.ones((), device="cuda")
    t_lt = _timeit(cp, lambda: [torch._scaled_mm(ta[i], tb[i].t(), scale_a=one, scale_b=one,
                                                 out_dtype=torch.bfloat16) for i in range(g)])
    fl = 2.0 * g * M * N * K
    log(f"grouped {g} x {M}x{N}x{K} e4m3 per-tensor, bf16 out: one launch {t_grouped * 1e3:.3f} ms "
        f"({fl / t_grouped / 1e12:.0f} TFLOPS); {g} fp8lab calls {t_calls * 1e3:.3f} ms; {g} cuBLASLt "
        f"calls {t_lt * 1e3:.3f} ms; speed-up over cuBLASLt calls {t_lt / t_grouped:.2f}x (target >= 2x)")
    return {"grouped_ms": t_grouped * 1e3, "calls_ms": t_calls * 1e3, "cublaslt_ms": t_lt * 1e3}


#: GEMMs of different shapes for the ragged grouped check (g, M, N, K): ragged tiles, a row
#: stride that needs a padded copy (K = 200), an empty output and K = 0 among them
RAGGED_CHECK = [(130, 200, 300), (1, 1, 1), (256, 128, 256), (0, 64, 128), (70, 136, 200),
                (129, 257, 130), (40, 30, 0)]
#: the benchmark's mix (recommendation-model layers: tall-skinny GEMMs of a few widths), cycled
RAGGED_BENCH = [(8192, 256, 256), (4096, 512, 256), (2048, 1024, 512), (8192, 128, 512),
                (16384, 256, 128), (4096, 256, 1024), (8192, 512, 512), (2048, 128, 256)]


def check_grouped_ragged(log, shapes=RAGGED_CHECK, pairs=PAIRS):
    """gemm_grouped on sequences of different shapes == separate gemm calls, bit for bit (same
    kernel and tile arithmetic), for every pair x scaling x out dtype; outputs poisoned first.
    Per case three calls: into given outputs, into its own, and the first again (its cached
    plan replayed)."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import gemm, gemm_grouped
    bad = n = 0
    for fa, fb in pairs:
        a = [_codes(cp, G, (M, K), fa) for M, N, K in shapes]
        b = [_codes(cp, G, (N, K), fb) for M, N, K in shapes]
        for scaling in ("tensor", "row_col", "block"):
            per = [_make_scales(cp, scaling, M, N, K) for M, N, K in shapes]
            sa, sb = [p[0] for p in per], [p[1] for p in per]
            for out_dtype in ("float32", "bfloat16"):
                odt = cp.uint16 if out_dtype == "bfloat16" else cp.float32
                poison = 0x7FC0 if out_dtype == "bfloat16" else np.nan
                out = [cp.full((M, N), poison, odt) for M, N, K in shapes]
                gemm_grouped(a, b, fa, fb, scale_a=sa, scale_b=sb, scaling=scaling,
                             out_dtype=out_dtype, out=out)
                got = gemm_grouped(a, b, fa, fb, scale_a=sa, scale_b=sb, scaling=scaling,
                                   out_dtype=out_dtype)   # its own outputs (one buffer)
                first = [o.copy() for o in out]
                for o in out:
                    o.fill(poison)
                gemm_grouped(a, b, fa, fb, scale_a=sa, scale_b=sb, scaling=scaling,
                             out_dtype=out_dtype, out=out)   # the same call again: its cached plan
                d = 0
                u = cp.uint16 if out_dtype == "bfloat16" else cp.uint32
                for i, (M, N, K) in enumerate(shapes):
                    want = gemm(a[i], b[i], fa, fb, scale_a=sa[i], scale_b=sb[i], scaling=scaling,
                                out_dtype=out_dtype).view(u)
                    d += sum(int((x[i].view(u) != want).sum()) for x in (first, got, out))
                n += 1
                if d:
                    bad += 1
                    log(f"RAGGED GROUPED MISMATCH {fa}x{fb} {scaling} {out_dtype}: {d}")
    log(f"ragged grouped check: {n} cases ({len(shapes)} shapes each), {bad} with differences "
        "from separate calls")
    return bad


def bench_grouped_ragged(log, g=64, shapes=RAGGED_BENCH):
    """g GEMMs of the shapes ``shapes`` (cycled), e4m3 per-tensor, bfloat16 out: one gemm_grouped
    launch against g torch._scaled_mm (cuBLASLt) calls, eager and as CUDA graphs (GPU time)."""
    import cupy as cp
    import torch
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import gemm_grouped
    from gpu_fused import _graph_time
    mix = [shapes[i % len(shapes)] for i in range(g)]
    a = [_codes(cp, G, (M, K), "e4m3") for M, N, K in mix]
    b = [_codes(cp, G, (N, K), "e4m3") for M, N, K in mix]
    out = [cp.empty((M, N), cp.uint16) for M, N, K in mix]
    fn = lambda: gemm_grouped(a, b, "e4m3", scale_a=1.0, scale_b=1.0, out_dtype="bfloat16", out=out)
    ta = [torch.from_dlpack(x).view(torch.float8_e4m3fn) for x in a]
    tb = [torch.from_dlpack(x).view(torch.float8_e4m3fn) for x in b]
    one = torch.ones((), device="cuda")
    lt = lambda: [torch._scaled_mm(x, y.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                  for x, y in zip(ta, tb)]
    t = {"fp8lab": (_timeit(cp, fn), _graph_time(cp, torch, fn, reps=10, n=5)),
         "cublaslt": (_timeit(cp, lt), _graph_time(cp, torch, lt, reps=10, n=5))}
    fl = sum(2.0 * M * N * K for M, N, K in mix)
    names = ", ".join(f"{M}x{N}x{K}" for M, N, K in shapes)
    for mode, i in (("eager", 0), ("graph", 1)):
        log(f"ragged grouped {g} GEMMs ({names}, cycled) e4m3 per-tensor, bf16 out, {mode}: one launch "
            f"{t['fp8lab'][i] * 1e3:.3f} ms ({fl / t['fp8lab'][i] / 1e12:.0f} TFLOPS); {g} cuBLASLt calls "
            f"{t['cublaslt'][i] * 1e3:.3f} ms ({fl / t['cublaslt'][i] / 1e12:.0f} TFLOPS); speed-up "
            f"{t['cublaslt'][i] / t['fp8lab'][i]:.2f}x")
    return {k: v for k, v in t.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--small", action="store_true", help="one tiny case (for compute-sanitizer)")
    ap.add_argument("--kernel", default="auto", help="auto, wgmma or mma")
    ap.add_argument("--grouped", action="store_true", help="grouped GEMM check and benchmark")
    ap.add_argument("--shapes", default=None, help="--bench and --variants shapes, e.g. 8192x8192x8192,2048x1024x1024")
    ap.add_argument("--variants", action="store_true",
                    help="wgmma kernel variants side by side, vs cuBLASLt")
    ap.add_argument("--wide", choices=("auto", "always", "never"), default=None,
                    help="fp8lab.gpu.gemm.WIDE_TILES for --check and --bench; --check also compares "
                         "wide and 128-wide tiles")
    ap.add_argument("--wide-fp8", type=int, default=None,
                    help="fp8lab.gpu.gemm.WIDE_FP8 (the FP8 wide tiles' width) for --check and --bench")
    ap.add_argument("--wide-only", action="store_true",
                    help="with --check --wide: only the wide against 128-wide comparison")
    ap.add_argument("--accuracy", action="store_true",
                    help="error vs float64: fp8lab vs cuBLASLt with and without fast accumulation")
    a = ap.parse_args(argv)
    import fp8lab.gpu
    ok, why = fp8lab.gpu.available()
    print("device:", why)
    if not ok:
        sys.exit(1)
    if a.small:
        # 70x136x2100: TMA-store epilogue (16-bit outputs) and split-K (4 splits) with its reduce
        bad = check(print, shapes=((70, 130, 200), (70, 136, 2100)), kernel=a.kernel)
        sys.exit(1 if bad else 0)
    if a.grouped:
        check_grouped(print)
        check_grouped_ragged(print)
        bench_grouped(print)
        bench_grouped_ragged(print)
    import fp8lab.gpu.gemm as GM
    if a.wide is not None:
        GM.WIDE_TILES = a.wide
    if a.wide_fp8 is not None:
        GM.WIDE_FP8 = a.wide_fp8
    if a.check:
        if not (a.wide_only and a.wide is not None):
            check(print, kernel=a.kernel)
        if a.wide is not None:
            check_wide(print)
    if a.variants:
        bench_variants(print, **({} if a.shapes is None else {"shapes": [tuple(int(v) for v in s.split("x"))
                                                                       for s in a.shapes.split(",")]}))
    if a.accuracy:
        accuracy(print)
    if a.bench:
        shapes = SHAPES if a.shapes is None else [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
        bench(print, shapes=shapes, kernel=a.kernel)


if __name__ == "__main__":
    main()
