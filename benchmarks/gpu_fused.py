"""Fused quantize-on-load and epilogue GEMM (fp8lab.gpu.gemm.gemm_fused): checks and speed.

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_fused.py [--check] [--bench] [--shapes MxNxK,...]

--check: (1) the conversions of fp8_cvt.cuh on their own (kernel fp8q_check: the careful route of
the epilogue and the fast route of the quantize-on-load) against the CPU's fp8lab.quantize: all
2^16 bfloat16 and all 2^16 float16 values, and 2^22 random float32 bit patterns, for e4m3 / e5m2,
saturating or not, at scales that take each of its paths (power of two, other, below 2^-60, far
above 1); (2) gemm_fused's kernel against its composed definition
(kernel="composed": cast_transpose, gemm, CuPy element-wise ops) bit for bit, for every input
kind (float32, float16, bfloat16, codes), output type, bias / ReLU / maxima, ragged and strided
shapes; (3) the quantize-on-load at every scale path, in the producer and converted once, with
NaN, Inf and huge values in A; (4) the codes written when A is converted once, for all 2^16
bfloat16 and float16 values at every scale path, against fp8lab.quantize. Exit status 1 on any
difference.
--bench: bfloat16 A, e4m3 B, bfloat16 out at a scale held on the device (delayed scaling), against
torch: the scaled cast ``(x * (1/s)).to(float8_e4m3fn)`` then ``torch._scaled_mm`` (cuBLASLt), and
torch's bf16 matmul; then the epilogue (bias, ReLU, e4m3 out + maximum) against _scaled_mm with
bias followed by torch's ReLU, maximum and cast, with A in bfloat16 and with A already codes (a
layer fed by the previous layer's 8-bit epilogue). Each timed eagerly (calls back to back) and as
a CUDA graph of 20 calls (GPU time only), medians of CUDA-event timings.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import warnings

import numpy as np

FMTS = ("e4m3", "e5m2")
BENCH_SHAPES = ((16384, 512, 512), (2048, 1024, 1024), (8192, 256, 256), (8192, 3456, 512),
                (65536, 1024, 1024))
# scales taking each path of fp8_cvt.cuh: powers of two in [2^-60, 2^60] (one multiply), others
# in that range (reciprocal or division + remainder, near both ends too), below 2^-60 (float64
# quotient), above 2^60 (division)
SCALES = (1.0, 0.75, 2.0 ** -10 * 1.7, 32.0, 2.0 ** -20, 448.0 / 3.0, 0.1, 2.0 ** -59 * 1.7, 2.0 ** 59 * 1.3,
          2.0 ** -70 * 1.3, 2.0 ** -64, 2.0 ** 70, 3.0e30)


def _all16(kind):
    bits = np.arange(1 << 16, dtype=np.uint32)
    if kind == "bfloat16":
        return (bits << 16).view(np.float32)
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def check_convert(log, n_random=1 << 22):
    """fp8q_check (the device conversion of the fused kernels) vs fp8lab.quantize on the CPU."""
    import cupy as cp
    import fp8lab
    from fp8lab.formats import get_format
    from fp8lab.gpu import _loader
    from fp8lab.gpu.gemm import _cvt_params
    warnings.simplefilter("ignore", RuntimeWarning)
    rng = np.random.default_rng(11)
    inputs = {"all bfloat16": _all16("bfloat16"), "all float16": _all16("float16"),
              "random float32": rng.integers(0, 1 << 32, n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)}
    n = bad = 0
    for name, x in inputs.items():
        xd = cp.asarray(x)
        refs = {}
        for (fi, fmt), fast in itertools.product(enumerate(FMTS), (0, 1)):
            k = _loader.kernel("gemm_wgmma.cu", f"fp8q_check<{fi + 1}, {fast}>")
            route = ("careful", "fast")[fast]
            f = get_format(fmt)
            for sat in (False, True):
                special, codes = _cvt_params(f, sat)
                for s in SCALES:
                    s32 = np.float32(s)
                    out = cp.empty(x.size // 2, cp.uint16)
                    k((min(-(-out.size // 256), 4096),), (256,),
                      (xd, out, np.int64(out.size), cp.full(1, s32, cp.float32), special, codes))
                    got = out.get().view(np.uint8)
                    if (fmt, sat, s) not in refs:
                        refs[fmt, sat, s] = fp8lab.quantize(x.reshape(1, -1), fmt, scaling="tensor",
                                                            scales=s32.reshape(1, 1), rounding="nearest_even",
                                                            saturate=sat).codes.reshape(-1)
                    ref = refs[fmt, sat, s]
                    d = int((got != ref).sum())
                    n += 1
                    if d:
                        bad += 1
                        i = int(np.flatnonzero(got != ref)[0])
                        log(f"MISMATCH convert {name} {fmt} {route} sat={sat} s={s32!r}: {d} codes differ; first "
                            f"x={x[i]!r} (0x{x.view(np.uint32)[i]:08x}) got 0x{got[i]:02x} want 0x{ref[i]:02x}")
        log(f"convert check: {name} done ({n} cases so far, {bad} with mismatches)")
    return bad


def _same(a, b):
    """Bitwise equality of two CuPy arrays, NaNs of float outputs counted equal to each other."""
    import cupy as cp
    if a.dtype == cp.uint16:   # bfloat16 bits
        na, nb = (a & 0x7FFF) > 0x7F80, (b & 0x7FFF) > 0x7F80
        return int(((a != b) & ~(na & nb)).sum())
    if a.dtype.kind == "f":
        na, nb = cp.isnan(a), cp.isnan(b)
        return int(((a.view(f"u{a.itemsize}") != b.view(f"u{b.itemsize}")) & ~(na & nb)).sum())
    return int((a != b).sum())


def check_gemm(log, shapes=((303, 300, 1000), (129, 257, 130), (1, 1, 1), (64, 200, 129), (256, 384, 512),
                            (200, 136, 72), (300, 512, 520), (130, 1024, 1024)),
               kinds=("bfloat16", "float16", "float32", "codes"),
               outs=("bfloat16", "e4m3", "float32", "float16", "e5m2")):
    """gemm_fused (fused wgmma kernel) vs gemm_fused(kernel="composed"), bit for bit."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import gemm_fused
    warnings.simplefilter("ignore", RuntimeWarning)
    rng = np.random.default_rng(5)
    n = bad = 0
    for si, (M, N, K) in enumerate(shapes):
        x = (rng.standard_normal((M, K + 3)) * 3).astype(np.float32)
        x[0, :min(K, 6)] = np.float32([np.nan, np.inf, -np.inf, 1e30, -0.0, 1e-30])[:min(K, 6)]
        for ki, kind in enumerate(kinds):
            fa = FMTS[int(si == 1)]   # e5m2 A on one shape, e5m2 B on another (few kernel instances)
            fb = FMTS[int(si == 3)]
            xs = x[:, 3:] if (si + ki) % 3 == 0 else x[:, :K]   # strided rows (unaligned) or not
            if kind == "bfloat16":
                a = _bf16_bits(cp, xs)
                if (si + ki) % 3 == 0:
                    wide = cp.zeros((M, K + 5), cp.uint16)
                    wide[:, 5:] = a
                    a = wide[:, 5:]
            elif kind == "float16":
                a = cp.asarray(xs.astype(np.float16))
            elif kind == "float32":
                a = cp.asarray(x)[:, 3:] if (si + ki) % 3 == 0 else cp.asarray(np.ascontiguousarray(xs))
            else:
                a = G.encode(cp.asarray(np.ascontiguousarray(xs)), fa, saturate=True)
            b = G.encode(cp.asarray(rng.standard_normal((N, K)).astype(np.float32)), fb, saturate=True)
            fin = np.abs(np.where(np.isfinite(xs), xs, 0))
            for oi, out_dtype in enumerate(outs):
                case = si * 31 + ki * 7 + oi
                sa = (cp.full(1, np.float32(max(float(fin.max()), 1.0) / 300.0), cp.float32)
                      if case % 2 else 2.0 ** -5)
                bias = cp.asarray(rng.standard_normal(N).astype(np.float32)) if case % 3 else None
                relu = case % 4 < 2
                kw = dict(scale_a=sa, scale_b=0.5, bias=bias, relu=relu, out_dtype=out_dtype,
                          bfloat16=kind == "bfloat16")
                if out_dtype in FMTS:
                    kw.update(out_scale=np.float32(0.02 * K ** 0.5), out_saturate=bool(case % 5 < 3))
                if kind != "codes":
                    kw["saturate"] = bool(case % 2)
                res = {}
                for kernel in ("fused", "composed"):
                    am = cp.zeros(1, cp.float32) if kind != "codes" else None
                    ao = cp.zeros(1, cp.float32)
                    c = gemm_fused(a, b, fa, fb, amax_a=am, amax_out=ao, kernel=kernel, check=False, **kw)
                    res[kernel] = (c, am, ao)
                (c1, am1, ao1), (c2, am2, ao2) = res["fused"], res["composed"]
                d = _same(c1, c2)
                da = 0 if am1 is None else int(am1.get().view(np.uint32)[0] != am2.get().view(np.uint32)[0])
                do = int(ao1.get().view(np.uint32)[0] != ao2.get().view(np.uint32)[0])
                n += 1
                if d or da or do:
                    bad += 1
                    log(f"MISMATCH fused {M}x{N}x{K} a={kind} {fa}x{fb} out={out_dtype} bias={bias is not None} "
                        f"relu={relu}: {d} outputs, amax_a {da}, amax_out {do}")
        log(f"fused gemm check: shape {M}x{N}x{K} ({n} cases so far, {bad} with mismatches)")
    return bad


def _bf16_bits(cp, x):
    """bfloat16 bits (uint16 on the device) of float32 ``x``, truncated: A as ``bfloat16=True`` takes it."""
    return cp.asarray(np.ascontiguousarray(x).view(np.uint32) >> 16).astype(cp.uint16)


def _vs_composed(a, b, **kw):
    """One e4m3 quantize-on-load call by the kernel and by its composed definition: (outputs that
    differ, whether amax_a differs)."""
    import cupy as cp
    from fp8lab.gpu.gemm import gemm_fused
    res = []
    for kernel in ("fused", "composed"):
        am = cp.zeros(1, cp.float32)
        res.append((gemm_fused(a, b, "e4m3", amax_a=am, kernel=kernel, check=False, **kw), am))
    return (_same(res[0][0], res[1][0]),
            int(res[0][1].get().view(np.uint32)[0] != res[1][1].get().view(np.uint32)[0]))


def check_repeat(log, shapes=((1100, 384, 700), (16384, 512, 512), (2048, 1024, 1024), (8192, 256, 256)),
                 kinds=("bfloat16", "float32")):
    """Quantize-on-load calls in a row on one shape (the kernel's unit counters and code buffer are
    reused from call to call), each against gemm_fused(kernel="composed") bit for bit, outputs and
    amax_a: a new input at a power-of-two scale, another at another scale, the first again."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    rng = np.random.default_rng(11)
    bad = n = 0
    for M, N, K in shapes:
        b = G.encode(cp.asarray(rng.standard_normal((N, K)).astype(np.float32)), "e4m3", saturate=True)
        xs = [(rng.standard_normal((M, K)) * (1 + i)).astype(np.float32) for i in range(2)]
        xs[1][M // 2, :3] = [np.nan, np.inf, 5e4]
        for kind in kinds:
            for x, sa in ((xs[0], 2.0 ** -4), (xs[1], 0.0217), (xs[0], 2.0 ** -4)):
                a = _bf16_bits(cp, x) if kind == "bfloat16" else cp.asarray(x)
                d, da = _vs_composed(a, b, scale_a=cp.full(1, np.float32(sa), cp.float32), out_dtype="bfloat16",
                                     bfloat16=kind == "bfloat16")
                n += 1
                if d or da:
                    bad += 1
                    log(f"MISMATCH repeated fused {M}x{N}x{K} a={kind} scale={sa}: {d} outputs, amax_a {da}")
        log(f"repeated fused calls: shape {M}x{N}x{K} ({n} cases so far, {bad} with mismatches)")
    return bad


def check_scale_paths(log, shapes=((300, 100, 520), (300, 300, 520))):
    """The quantize-on-load at every scale of SCALES (each path of fp8_cvt.cuh: the careful route
    of the division and float64 paths runs for every chunk, that of the others on blocks holding
    NaN, Inf or an overflow), in the producer (one tile column) and converted once (three),
    bfloat16 and float32 A, saturating or not, against gemm_fused(kernel="composed") bit for bit:
    float32 out, and amax_a."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    rng = np.random.default_rng(12)
    bad = n = 0
    for M, N, K in shapes:
        x = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-20, 20, (M, 1)))).astype(np.float32)
        x[1, :4] = [np.nan, np.inf, -np.inf, 3e38]
        b = G.encode(cp.asarray(rng.standard_normal((N, K)).astype(np.float32)), "e4m3", saturate=True)
        for kind in ("bfloat16", "float32"):
            a = _bf16_bits(cp, x) if kind == "bfloat16" else cp.asarray(x)
            for i, sa in enumerate(SCALES):
                d, da = _vs_composed(a, b, scale_a=np.float32(sa), saturate=bool(i % 2), out_dtype="float32",
                                     bfloat16=kind == "bfloat16")
                n += 1
                if d or da:
                    bad += 1
                    log(f"MISMATCH scale path {M}x{N}x{K} a={kind} scale={sa!r}: {d} outputs, amax_a {da}")
        log(f"scale paths: shape {M}x{N}x{K} ({n} cases so far, {bad} with mismatches)")
    return bad


def check_codes(log, M=256, N=256, scales=SCALES):
    """The codes the quantize-on-load writes when converting A once (its code buffer, read back
    after the call) for all 2^16 bfloat16 and all 2^16 float16 values in A (M x 2^16 / M), at
    every scale of ``scales``, e4m3 and e5m2, saturating or not, against fp8lab.quantize on the CPU;
    and amax_a against gemm_fused(kernel="composed")."""
    import cupy as cp
    import fp8lab
    import fp8lab.gpu.codecs as G
    import fp8lab.gpu.gemm as GM
    warnings.simplefilter("ignore", RuntimeWarning)
    K = (1 << 16) // M
    if -(-N // 128) < GM.QA_ONCE_MIN_TILES_N:
        raise ValueError(f"N={N} gives fewer than QA_ONCE_MIN_TILES_N={GM.QA_ONCE_MIN_TILES_N} tile columns: "
                         "A would be converted in the producer, with no code buffer to read back")
    b = G.encode(cp.asarray(np.random.default_rng(13).standard_normal((N, K)).astype(np.float32)), "e4m3",
                 saturate=True)
    bits = np.arange(1 << 16, dtype=np.uint16)

    def run(a, kind, kernel, fmt, sat, s32):   # one call; amax_a's bits
        am = cp.zeros(1, cp.float32)
        GM.gemm_fused(a, b, fmt, "e4m3", scale_a=s32, saturate=sat, amax_a=am, out_dtype="float32",
                      bfloat16=kind == "bfloat16", kernel=kernel, check=False)
        return int(am.get().view(np.uint32)[0])

    bad = n = 0
    for kind in ("bfloat16", "float16"):
        x = _all16(kind)
        a = cp.asarray(bits if kind == "bfloat16" else bits.view(np.float16)).reshape(M, K)
        # the maximum of finite |x| depends on the input only: the composed definition's, once
        want_amax = run(a, kind, "composed", FMTS[0], True, np.float32(1.0))
        for fmt, sat, s in itertools.product(FMTS, (False, True), scales):
            s32 = np.float32(s)
            da = int(run(a, kind, "fused", fmt, sat, s32) != want_amax)
            got = GM._qa_codes(M, K, cp).get().reshape(-1)
            ref = fp8lab.quantize(x.reshape(1, -1), fmt, scaling="tensor", scales=s32.reshape(1, 1),
                                  rounding="nearest_even", saturate=sat).codes.reshape(-1)
            d = int((got != ref).sum())
            n += 1
            if d or da:
                bad += 1
                j = int(np.flatnonzero(got != ref)[0]) if d else 0
                log(f"MISMATCH phase-1 codes {kind} {fmt} sat={sat} s={s32!r}: {d} codes differ (first x={x[j]!r} "
                    f"got 0x{got[j]:02x} want 0x{ref[j]:02x}), amax_a {da}")
        log(f"phase-1 codes: all {kind} values done ({n} cases so far, {bad} with mismatches)")
    return bad


def _graph_time(cp, torch, fn, reps=20, n=20):
    """GPU seconds per call of ``fn``: a CUDA graph of ``n`` calls (captured on a torch stream that
    CuPy launches on too), replayed; median over ``reps``."""
    from dlrm_step_gpu import capture_graph
    graph = capture_graph(cp, torch, fn, n)
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e-3 / n)
    return float(np.median(ts))


def bf16_input(cp, torch, M, K):
    """The fused benchmarks' A: bfloat16 N(0, 4) (the torch tensor and its bits as CuPy uint16),
    its delayed scale on the device (amax / 448, shape (1,)) and that rounded up to a power of two."""
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 2
    s = (x.abs().max().float() / 448).reshape(1)
    return x, cp.from_dlpack(x.view(torch.int16)).view(cp.uint16), s, torch.exp2(torch.ceil(torch.log2(s)))


def torch_cast_mm(torch, x, w8, s):
    """The separate-cast baseline as a call: torch's scaled cast ``(x * (1/s)).to(float8_e4m3fn)``
    then ``torch._scaled_mm`` with e4m3 ``w8`` (N x K), bfloat16 out."""
    one, inv = torch.ones((), device="cuda"), 1.0 / s
    return lambda: torch._scaled_mm((x * inv).to(torch.float8_e4m3fn), w8.t(), scale_a=s, scale_b=one,
                                    out_dtype=torch.bfloat16)


def bench(log, shapes=BENCH_SHAPES):
    import cupy as cp
    import torch
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import gemm_fused
    from gpu_gemm import _timeit
    rows = []
    for (M, N, K) in shapes:
        x, xb, s, s2 = bf16_input(cp, torch, M, K)
        w = G.encode(cp.random.standard_normal((N, K), dtype=cp.float32), "e4m3", saturate=True)
        w8 = torch.from_dlpack(w).view(torch.float8_e4m3fn)
        s2_cp = cp.from_dlpack(s2)
        inv = 1.0 / s
        a_codes = G.encode(cp.from_dlpack(x.float()) / cp.from_dlpack(s), "e4m3", saturate=True)
        a8 = torch.from_dlpack(a_codes).view(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        s_cp = cp.from_dlpack(s)
        out = cp.empty((M, N), cp.uint16)
        bias = torch.randn(N, device="cuda")
        bias_cp = cp.from_dlpack(bias)
        bias16 = bias.to(torch.bfloat16)   # _scaled_mm takes a bf16 bias with a bf16 output
        so = torch.full((1,), 0.05 * K ** 0.5, device="cuda")
        so_cp = cp.from_dlpack(so)
        amax = cp.zeros(1, cp.float32)
        amax_t = torch.zeros((), device="cuda")
        out8 = cp.empty((M, N), cp.uint8)
        xw = x @ torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()  # warm cuBLAS
        wb = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        del xw

        fns = {
            "torch cast + _scaled_mm": torch_cast_mm(torch, x, w8, s),
            "fp8lab gemm_fused": lambda: gemm_fused(xb, w, "e4m3", scale_a=s_cp, out_dtype="bfloat16", out=out,
                                                    bfloat16=True, check=False),
            "fp8lab gemm_fused pow2": lambda: gemm_fused(xb, w, "e4m3", scale_a=s2_cp, out_dtype="bfloat16",
                                                         out=out, bfloat16=True, check=False),
            "fp8lab codes (no cast)": lambda: gemm_fused(a_codes, w, "e4m3", scale_a=s_cp, out_dtype="bfloat16",
                                                         out=out, check=False),
            "torch bf16 matmul": lambda: x @ wb.t(),
            "torch epilogue": lambda: _torch_epi(torch, (x * inv).to(torch.float8_e4m3fn), w8, s, one, bias16, so,
                                                 amax_t),
            "torch epilogue codes in": lambda: _torch_epi(torch, a8, w8, s, one, bias16, so, amax_t),
            "fp8lab epilogue": lambda: gemm_fused(xb, w, "e4m3", scale_a=s2_cp, bias=bias_cp, relu=True,
                                                  out_dtype="e4m3", out_scale=so_cp, out_saturate=True,
                                                  amax_out=amax, out=out8, bfloat16=True, check=False),
            # layers chained through 8-bit outputs: A arrives as codes from the previous epilogue
            "fp8lab epilogue codes in": lambda: gemm_fused(a_codes, w, "e4m3", scale_a=s_cp, bias=bias_cp,
                                                           relu=True, out_dtype="e4m3", out_scale=so_cp,
                                                           out_saturate=True, amax_out=amax, out=out8,
                                                           check=False),
        }
        r = {"shape": (M, N, K)}
        for name, fn in fns.items():
            r[name] = (_timeit(cp, fn, reps=20, calls=10), _graph_time(cp, torch, fn))
        rows.append(r)
        log(_line(r))
    log("ratios: > 1 means fp8lab faster; eager = calls back to back, graph = GPU time of a CUDA graph")
    for r in rows:
        log(_line(r))
    return rows


def _torch_epi(torch, a8, w8, s, one, bias, so, amax_t):
    y = torch._scaled_mm(a8, w8.t(), scale_a=s, scale_b=one, bias=bias, out_dtype=torch.bfloat16)
    y = torch.relu(y)
    torch.maximum(amax_t, y.abs().max().float(), out=amax_t)
    return (y / so).to(torch.float8_e4m3fn)


def _line(r):
    """One shape: each variant's ms per call (eager | graph), and the fused ones' speed-up over
    torch's cast + _scaled_mm (epilogue: over torch's version of the same)."""
    M, N, K = r["shape"]
    base = r["torch cast + _scaled_mm"]
    parts = [f"{M}x{N}x{K}:"]
    for name, t in r.items():
        if name == "shape":
            continue
        ref = r["torch epilogue codes in" if "codes in" in name else "torch epilogue"] if "epilogue" in name else base
        parts.append(f"  {name:<24s} eager {t[0] * 1e3:.4f} ms  graph {t[1] * 1e3:.4f} ms"
                     + (f"  speed-up eager {ref[0] / t[0]:.2f}x graph {ref[1] / t[1]:.2f}x" if name.startswith("fp8lab") else ""))
    return "\n".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--shapes", default=None, help="bench shapes, e.g. 16384x512x512,8192x256x256")
    a = ap.parse_args(argv)
    import fp8lab.gpu
    ok, why = fp8lab.gpu.available()
    print("device:", why)
    if not ok:
        sys.exit(1)
    bad = 0
    if a.check:
        bad += check_convert(print)
        bad += check_gemm(print)
        bad += check_repeat(print)
        bad += check_scale_paths(print)
        bad += check_codes(print)
    if a.bench:
        shapes = BENCH_SHAPES if a.shapes is None else [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
        bench(print, shapes)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
