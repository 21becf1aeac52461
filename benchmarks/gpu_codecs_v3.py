"""One device call for the v3 codec kernels, the fused hif8 operand decode and the fused amax:
bit-identity checks first, then timings (H200; torch is a baseline only).

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_codecs_v3.py [--skip-gemm] [--skip-quantize]

Encode (fp8_encode_lut32, every variant of codecs._LUT32_VARIANTS): all 2^32 float32 inputs, 5
formats x 3 deterministic modes x saturate, against the CPU's float32 table (fp8lab.codecs._lut),
plus a misaligned and a ragged array (scalar tail). Decode (fp8_decode_v3, every variant):
2^24 + 7 random codes (all 256 values) and a misaligned slice against a gather from the CPU's
table; all 256 codes x 5 formats x 4 dtypes through fp8lab.gpu.decode vs fp8lab.decode.
Timing: median of 20, each over a batch of 10 calls between two events (kernel throughput,
the Python call overhead hidden behind the queued kernels) and single calls (as the v2 table).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def timed(cp, fn, batch=10, reps=20):
    for _ in range(3):
        fn()
    out = []
    for b in (batch, 1):
        ts = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            for _ in range(b):
                fn()
            e1.record()
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / b)
        out.append(float(np.median(ts)))
    return out  # (batched, single)


def check_encode(cp, G, fp8lab):
    from fp8lab.codecs import _lut
    from fp8lab.formats import ROUNDING_MODES, get_format
    # (a ReductionKernel with a raw table argument raised NotImplementedError('Illegal conditions')
    # in CuPy 14.2 on the H200: an elementwise mismatch mask and count_nonzero instead)
    ew = cp.ElementwiseKernel("uint32 u, uint8 c, raw uint8 lut", "bool m",
                              "m = lut[((u >> 15) & 0x1FFFEu) | ((u & 0xFFFFu) != 0u ? 1u : 0u)] != c",
                              "fp8lab_lut_mism")
    red = lambda u, c, lut, axis=None: cp.count_nonzero(ew(u.reshape(-1), c.reshape(-1), lut))
    base = cp.arange(1 << 30, dtype=cp.uint32)
    u = cp.empty_like(base)
    codes = cp.empty(1 << 30, cp.uint8)
    tot, configs = {}, 0
    t0 = time.time()
    for fn in fp8lab.list_formats():
        f = get_format(fn)
        for mode in ROUNDING_MODES[:3]:
            for sat in (False, True):
                lut = cp.asarray(_lut(f, "float32", mode, sat))
                for unr, half, cs, glob in G._LUT32_VARIANTS:
                    cfg = (unr, half, 512 if glob else 1024 if not half else 512,
                           0 if glob else 1 if not half else 2, cs, glob)
                    bad = 0
                    for ch in range(4):
                        cp.add(base, np.uint32(ch << 30), out=u)
                        G._encode_lut32(u.view(cp.float32), codes, f, mode, sat, cfg)
                        bad += int(red(u.reshape(1 << 14, 1 << 16), codes.reshape(1 << 14, 1 << 16),
                                       lut, axis=1).sum())
                    # misaligned start (scalar path) and a ragged length (vector part + tail)
                    for sl in (slice(1, 1000003), slice(0, (1 << 22) + 13)):
                        xs = u[sl]
                        cx = cp.empty(xs.size, cp.uint8)
                        G._encode_lut32(xs.view(cp.float32), cx, f, mode, sat, cfg)
                        bad += int(red(xs, cx, lut))
                    tot[f"{fn}/{mode}/sat={int(sat)}/unr={unr},half={int(half)},cs={int(cs)},g={int(glob)}"] = bad
                    configs += 1
                    if bad:
                        log(f"ENCODE MISMATCH {fn} {mode} sat={sat} unr={unr} half={half} cs={cs}: {bad}")
    cp.cuda.Device().synchronize()
    nb = sum(tot.values())
    log(f"encode lut32: {configs} (format, mode, sat, variant) configs x all 2^32 float32 (+ 2 tail "
        f"arrays): {nb} mismatches ({time.time() - t0:.1f} s)")
    del base, u, codes
    cp.get_default_memory_pool().free_all_blocks()
    return tot


def check_cvt(cp, G, fp8lab):
    """fp8_encode_cvt (hardware conversion, e4m3/e5m2 nearest even): all 2^32 float32 inputs x
    saturate x launch variants against the CPU's float32 table, plus a misaligned and a ragged
    array (scalar tail)."""
    from fp8lab.codecs import _lut
    from fp8lab.formats import get_format
    ew = cp.ElementwiseKernel("uint32 u, uint8 c, raw uint8 lut", "bool m",
                              "m = lut[((u >> 15) & 0x1FFFEu) | ((u & 0xFFFFu) != 0u ? 1u : 0u)] != c",
                              "fp8lab_lut_mism")
    base = cp.arange(1 << 30, dtype=cp.uint32)
    u = cp.empty_like(base)
    codes = cp.empty(1 << 30, cp.uint8)
    tot = {}
    t0 = time.time()
    for fn in G.CVT_FORMATS:
        f = get_format(fn)
        for sat in (False, True):
            lut = cp.asarray(_lut(f, "float32", "nearest_even", sat))
            for unr in G._CVT_UNR:
                cfg = (unr, 512, 0 if unr == 2 else 4, unr != 4)
                bad = 0
                for ch in range(4):
                    cp.add(base, np.uint32(ch << 30), out=u)
                    G._encode_cvt(u.view(cp.float32), codes, f, sat, cfg)
                    bad += int(cp.count_nonzero(ew(u, codes, lut)))
                for sl in (slice(1, 1000003), slice(0, (1 << 22) + 13)):
                    xs = u[sl]
                    cs = cp.empty(xs.size, cp.uint8)
                    G._encode_cvt(xs.view(cp.float32), cs, f, sat, cfg)
                    bad += int(cp.count_nonzero(ew(xs, cs, lut)))
                tot[f"{fn}/sat={int(sat)}/unr={unr}"] = bad
                if bad:
                    log(f"CVT MISMATCH {fn} sat={sat} unr={unr}: {bad}")
    cp.cuda.Device().synchronize()
    log(f"encode cvt: {len(tot)} (format, sat, variant) configs x all 2^32 float32 (+ 2 tail arrays): "
        f"{sum(tot.values())} mismatches ({time.time() - t0:.1f} s)")
    del base, u, codes
    cp.get_default_memory_pool().free_all_blocks()
    return tot


def check_decode(cp, G, fp8lab):
    import ml_dtypes
    from fp8lab.formats import get_format
    rng = np.random.default_rng(5)
    n = (1 << 24) + 7
    c = cp.asarray(rng.integers(0, 256, n, dtype=np.uint8))
    c[:256] = cp.arange(256, dtype=cp.uint8)
    f = get_format("hif8")
    res = {}
    for nb, unr, repl in G._DECODE_VARIANTS:
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[nb]
        name = {2: "float16", 4: "float32", 8: "float64"}[nb]
        tab = cp.asarray(np.ascontiguousarray(f.decode_table(name)).view(bits))
        bad = 0
        for sl in (slice(0, n), slice(1, n - 3), slice(0, 1 << 20)):
            cs = c[sl]
            out = cp.empty(cs.size, bits)
            G._decode_v3(cs, out, tab, f, nb, (unr, repl, 512, 4))
            bad += int((out != tab[cs.astype(cp.int32)]).sum())
        res[f"{nb}B/unr={unr},repl={int(repl)}"] = bad
        if bad:
            log(f"DECODE MISMATCH {nb}B unr={unr} repl={repl}: {bad}")
    log(f"decode v3: {len(res)} variants x (2^24+7 random codes, misaligned, 2^20): "
        f"{sum(res.values())} mismatches vs the table gather")
    dec = {}
    codes = cp.arange(256, dtype=cp.uint8)
    for fn in fp8lab.list_formats():
        for dt in ("float16", "bfloat16", "float32", "float64"):
            g = G.decode(codes, fn, dtype=dt).get()
            g = g.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[g.dtype.itemsize])
            r = fp8lab.decode(np.arange(256, dtype=np.uint8), fn,
                              dtype=ml_dtypes.bfloat16 if dt == "bfloat16" else dt)
            r = r.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[r.dtype.itemsize])
            dec[f"{fn}/{dt}"] = int((g != r).sum())
    log(f"decode all 256 codes x 5 formats x 4 dtypes (defaults) vs fp8lab.decode: "
        f"{sum(dec.values())} mismatches")
    return res, dec


ENC_CFGS = [(4, False, 1024, 1, False), (8, False, 1024, 1, False), (8, True, 512, 3, False),
            (2, False, 512, 0, False, True), (4, False, 512, 0, False, True),
            (2, False, 256, 0, False, True), (4, False, 256, 0, False, True),
            (8, False, 512, 4, False, True), (2, False, 512, 0, True, True)]
CVT_CFGS = [(4, 512, 4, True), (8, 512, 4, True), (4, 512, 4, False), (8, 512, 4, False),
            (4, 256, 0, False), (2, 256, 0, False), (4, 256, 0, True), (2, 512, 0, False)]
DEC_CFGS = [(4, False, 512, 4), (8, False, 512, 4), (4, True, 512, 4), (8, True, 512, 4),
            (4, True, 256, 8), (8, True, 1024, 2), (4, True, 512, 12)]


def bench_codecs(cp, G, res):
    from fp8lab.formats import get_format
    n = 1 << 28
    x = cp.random.standard_normal(n, dtype=cp.float32)
    y = cp.empty_like(x)
    rows = []
    tb, ts = timed(cp, lambda: cp.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, x.nbytes, 3, 0))
    copy = 2 * x.nbytes / tb
    rows.append(("copy (memcpy d2d)", copy, 2 * x.nbytes / ts))
    import torch
    tx = torch.from_dlpack(x)
    tb, ts = timed(cp, lambda: tx.to(torch.float8_e4m3fn))
    torch_bw = 5 * n / tb
    rows.append(("torch f32->float8_e4m3fn", torch_bw, 5 * n / ts))
    t8 = tx.to(torch.float8_e4m3fn)
    tb, ts = timed(cp, lambda: t8.to(torch.float32))
    rows.append(("torch float8_e4m3fn->f32", 5 * n / tb, 5 * n / ts))
    tb, ts = timed(cp, lambda: t8.to(torch.float16))
    rows.append(("torch float8_e4m3fn->f16", 3 * n / tb, 3 * n / ts))
    out = cp.empty(n, cp.uint8)
    best = {}
    for fn in ("e4m3", "e5m2", "hif8"):
        f = get_format(fn)
        for cfg in ENC_CFGS:
            tb, ts = timed(cp, lambda: G._encode_lut32(x, out, f, "nearest_even", False, cfg))
            rows.append((f"encode f32->{fn} lut32{cfg}", 5 * n / tb, 5 * n / ts))
            best.setdefault(("enc", fn), []).append((5 * n / tb, cfg))
        if fn in G.CVT_FORMATS:
            for cfg in CVT_CFGS:
                tb, ts = timed(cp, lambda: G._encode_cvt(x, out, f, False, cfg))
                rows.append((f"encode f32->{fn} cvt{cfg}", 5 * n / tb, 5 * n / ts))
                best.setdefault(("cvt", fn), []).append((5 * n / tb, cfg))
        tb, ts = timed(cp, lambda: G.encode(x, fn))
        rows.append((f"encode f32->{fn} [default G.encode]", 5 * n / tb, 5 * n / ts))
    codes = G.encode(x, "e4m3")
    for nb, name, per in ((4, "float32", 5), (2, "float16", 3)):
        for fn in ("e4m3", "hif8"):
            f = get_format(fn)
            bits = {2: np.uint16, 4: np.uint32}[nb]
            tab = cp.asarray(np.ascontiguousarray(f.decode_table(name)).view(bits))
            o = cp.empty(n, bits)
            for cfg in DEC_CFGS:
                tb, ts = timed(cp, lambda: G._decode_v3(codes, o, tab, f, nb, cfg))
                rows.append((f"decode {fn}->{name} v3{cfg}", per * n / tb, per * n / ts))
                best.setdefault(("dec", nb, fn), []).append((per * n / tb, cfg))
            tb, ts = timed(cp, lambda: G.decode(codes, fn, dtype=name))
            rows.append((f"decode {fn}->{name} [default G.decode]", per * n / tb, per * n / ts))
    log(f"\n{'codec (2^28 elements), GB/s batched | single call':58s} {'GB/s':>6s} {'/copy':>6s} "
        f"{'/torch':>6s} {'single':>6s} {'/copy':>6s}")
    out_rows = []
    for name, bw, bw1 in rows:
        log(f"{name:58s} {bw / 1e9:6.0f} {bw / copy:6.3f} {bw / torch_bw:6.3f} {bw1 / 1e9:6.0f} {bw1 / copy:6.3f}")
        out_rows.append({"name": name, "GBps": bw / 1e9, "vs_copy": bw / copy, "vs_torch": bw / torch_bw,
                         "GBps_single": bw1 / 1e9})
    for k, v in best.items():
        bw, cfg = max(v)
        log(f"best {k}: {cfg} {bw / 1e9:.0f} GB/s {bw / copy:.3f} of copy {bw / torch_bw:.3f} of torch")
    res["bandwidth"] = out_rows
    res["best"] = {str(k): max(v) for k, v in best.items()}
    del x, y, out, codes, tx, t8
    cp.get_default_memory_pool().free_all_blocks()


def gemm_part(cp, res):
    import gpu_gemm
    import fp8lab.gpu.gemm as GM
    gpu_gemm.PAIRS = [p for p in gpu_gemm.PAIRS if "hif8" in p]
    res["gemm_f16_check_failures"] = gpu_gemm.check(log)
    shapes = [(16384, 512, 512), (2048, 1024, 1024), (8192, 256, 256)]
    for fused in (True, False):
        GM.FUSED_DECODE = fused
        log(f"gemm bench, FUSED_DECODE={fused}")
        res[f"gemm_bench_fused={int(fused)}"] = gpu_gemm.bench(log, shapes=shapes)
    GM.FUSED_DECODE = True
    import fp8lab.gpu.codecs as G
    for (M, N, K) in shapes:
        a = G.encode(cp.random.standard_normal((M, K), dtype=cp.float32), "hif8", saturate=True)
        b = G.encode(cp.random.standard_normal((N, K), dtype=cp.float32), "hif8", saturate=True)
        o = cp.empty((M, N), cp.uint16)
        f = lambda: GM.gemm(a, b, "hif8", out_dtype="bfloat16", out=o)
        for _ in range(3):
            f()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            f()
        th = (time.perf_counter() - t0) / 50
        cp.cuda.Device().synchronize()
        tg = timed(cp, f)
        log(f"hif8 {M}x{N}x{K}: host {th * 1e6:.1f} us/call (no sync), GPU batched {tg[0] * 1e6:.1f} us "
            f"({2 * M * N * K / tg[0] / 1e12:.0f} TFLOPS), single {tg[1] * 1e6:.1f} us")


def quantize_part(cp, res):
    import gpu_quantize
    import fp8lab.gpu.quantize as Q
    Q.FUSED_AMAX = True   # the path under test
    gpu_quantize.RECIPES = ["tensor", "tensor,pow2", "channel", "block", "block:32", "tile:64,pow2",
                            "mx"]
    bad = gpu_quantize.check(log, shapes=[(303, 300), (1000,), (4, 70000)])
    res["quantize_check_mismatch_cases"] = bad
    from fp8lab.gpu.quantize import quantize
    x = cp.random.standard_normal((8192, 8192), dtype=cp.float32)
    for rec in ("tensor", "channel", "block", "tile"):
        t = timed(cp, lambda: quantize(x, "e4m3", scaling=rec), batch=3, reps=5)
        log(f"quantize 8192x8192 float32 -> e4m3 {rec}: {t[1] * 1e3:.2f} ms per call")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-gemm", action="store_true")
    ap.add_argument("--skip-quantize", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--checks", default="cvt,encode,decode", help="which bit-identity checks to run")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp
    import fp8lab
    import fp8lab.gpu
    import fp8lab.gpu.codecs as G
    ok, why = fp8lab.gpu.available()
    log("device:", why)
    res = {"device": why, "date": time.strftime("%Y-%m-%d")}
    steps = []
    checks = [] if a.skip_check else a.checks.split(",")
    if "cvt" in checks:
        steps.append(("cvt_check", lambda: res.__setitem__("cvt", check_cvt(cp, G, fp8lab))))
    if "encode" in checks:
        steps.append(("encode_check", lambda: res.__setitem__("encode", check_encode(cp, G, fp8lab))))
    if "decode" in checks:
        steps.append(("decode_check", lambda: res.__setitem__("decode", check_decode(cp, G, fp8lab))))
    steps.append(("bench", lambda: bench_codecs(cp, G, res)))
    if not a.skip_gemm:
        steps.append(("gemm", lambda: gemm_part(cp, res)))
    if not a.skip_quantize:
        steps.append(("quantize", lambda: quantize_part(cp, res)))
    for name, fn in steps:
        t0 = time.time()
        try:
            fn()
        except Exception as exc:  # keep going: later steps are independent
            import traceback
            log(f"STEP {name} FAILED: {exc!r}\n{traceback.format_exc()}")
        log(f"[{name}: {time.time() - t0:.1f} s]")
        with open(os.path.join(a.out, "v3.json"), "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        with open(os.path.join(a.out, "v3.log"), "w") as fh:
            fh.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
