"""One device call: compile, check bit-exactness and time fp8lab's GPU codecs (and GEMMs).

    PYTHONPATH=. python3 benchmarks/gpu_check.py [--codecs] [--gemm] [--out DIR]

Codecs: (1) all 2^32 float32 inputs, every format x deterministic mode x saturate, three device
paths against the CPU's float32 table; (2) fp8lab.gpu.encode against fp8lab.encode (Numba, CPU)
on a dense random sample plus all special values, every mode (stochastic with one seed), and
exhaustively on all float16 / bfloat16 inputs; decode of all 256 codes into every dtype;
(3) bandwidth against a device copy and torch's float32 -> float8_e4m3fn cast (baseline only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import fp8lab
from fp8lab.formats import ROUNDING_MODES

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def timeit(fn, reps=20, warm=3):
    import cupy as cp
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return float(np.median(ts))


def sample_f32(rng, n):
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    vals = (rng.standard_normal(n // 2) * np.exp2(rng.integers(-30, 20, n // 2))).astype(np.float32)
    bits[: n // 2] = vals.view(np.uint32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 3.4e38],
                       np.float32).view(np.uint32)
    # every code's value and the midpoints between neighbours, +- one ulp, in float32
    extra = []
    for f in fp8lab.list_formats():
        v = np.unique(np.abs(fp8lab.get_format(f).decode_table("float64")))
        v = v[np.isfinite(v)]
        mids = (v[1:] + v[:-1]) / 2
        pts = np.concatenate([v, mids, [v[-1] + (v[-1] - v[-2]) / 2, v[-1] * 2]]).astype(np.float32)
        u = pts.view(np.uint32)
        extra += [u, u + 1, u - 1, u | 0x80000000]
    extra = np.concatenate([special] + extra).astype(np.uint32)
    bits[: extra.size] = extra
    return bits.view(np.float32)


def check_codecs(rng, res):
    import cupy as cp
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.check import check_float32_all

    import ml_dtypes
    fmts = fp8lab.list_formats()
    # (1) exhaustive float32
    t0 = time.time()
    total = {}
    for f in fmts:
        for mode in ROUNDING_MODES[:3]:
            for sat in (False, True):
                r = check_float32_all(f, mode, sat)
                total[f"{f}/{mode}/sat={int(sat)}"] = r
                bad = {k: v for k, v in r.items() if v[0]}
                log(f"all2^32 {f:9s} {mode:13s} sat={int(sat)} mismatches "
                    + " ".join(f"{k}={v[0]}" for k, v in r.items()) + (f" FIRST {bad}" if bad else ""))
    cp.cuda.Device().synchronize()
    log(f"exhaustive float32: {len(total)} configs x 2^32 x 3 paths in {time.time() - t0:.1f} s")
    res["exhaustive"] = total
    # (2) against the CPU (Numba) on samples
    n = int(os.environ.get("FP8LAB_SAMPLE", 1 << 25))
    x32 = sample_f32(rng, n)
    x64 = np.concatenate([x32[: n // 4].astype(np.float64),
                          rng.standard_normal(n // 4) * np.exp2(rng.integers(-30, 20, n // 4)),
                          rng.integers(0, 1 << 63, n // 4, dtype=np.int64).view(np.float64)])
    x16 = np.arange(1 << 16, dtype=np.uint16)
    d32, d64, d16 = cp.asarray(x32), cp.asarray(x64), cp.asarray(x16)
    seed = int(rng.integers(0, 1 << 62))
    cpu_total = {}
    for f in fmts:
        for mode in ROUNDING_MODES:
            for sat in (False, True):
                kw = dict(rounding=mode, saturate=sat, seed=seed if mode == "stochastic" else None)
                r = {}
                c32 = fp8lab.encode(x32, f, **kw)
                r["f32"] = int((G.encode(d32, f, **kw).get() != c32).sum())
                if mode != "stochastic":
                    r["f32_lut"] = int((G.encode(d32, f, path="lut", **kw).get() != c32).sum())
                r["f64"] = int((G.encode(d64, f, **kw).get() != fp8lab.encode(x64, f, **kw)).sum())
                r["f64_via32"] = int((G.encode(d64, f, via_float32=True, **kw).get()
                                      != fp8lab.encode(x64, f, via_float32=True, **kw)).sum())
                r["f16_all"] = int((G.encode(d16.view(cp.float16), f, **kw).get()
                                    != fp8lab.encode(x16.view(np.float16), f, **kw)).sum())
                r["bf16_all"] = int((G.encode(d16, f, bfloat16=True, **kw).get()
                                     != fp8lab.encode(x16.view(ml_dtypes.bfloat16), f, **kw)).sum())
                cpu_total[f"{f}/{mode}/sat={int(sat)}"] = r
                log(f"vsCPU {f:9s} {mode:13s} sat={int(sat)} " + " ".join(f"{k}={v}" for k, v in r.items()))
    res["vs_cpu"] = cpu_total
    res["vs_cpu_sample"] = {"f32": n, "f64": int(x64.size), "seed": seed}
    codes = cp.arange(256, dtype=cp.uint8)
    dec = {}
    for f in fmts:
        for dt in ("float16", "bfloat16", "float32", "float64"):
            g = G.decode(codes, f, dtype=dt).get()
            g = g.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[g.dtype.itemsize])
            c = fp8lab.decode(np.arange(256, dtype=np.uint8), f,
                              dtype=ml_dtypes.bfloat16 if dt == "bfloat16" else dt)
            c = c.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[c.dtype.itemsize])
            dec[f"{f}/{dt}"] = int((g != c).sum())
    log("decode all 256 codes, mismatches:", dec)
    res["decode"] = dec


def bench_codecs(rng, res):
    import cupy as cp
    import fp8lab.gpu.codecs as G
    n = 1 << 28
    x = cp.asarray(rng.standard_normal(n, dtype=np.float32))
    y = cp.empty_like(x)
    t = timeit(lambda: y.__setitem__(slice(None), x))  # device copy (elementwise kernel)
    t2 = timeit(lambda: cp.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, x.nbytes, 3, 0))
    copy_bw = 2 * x.nbytes / min(t, t2)
    rows = [("copy (memcpy d2d)", 2 * x.nbytes / t2, None), ("copy (cupy y[:]=x)", 2 * x.nbytes / t, None)]
    try:
        import torch
        tx = torch.from_dlpack(x)
        tt = timeit(lambda: tx.to(torch.float8_e4m3fn))
        torch_bw = 5 * n / tt
        rows.append(("torch f32->float8_e4m3fn", torch_bw, None))
    except Exception as exc:
        torch_bw = None
        log("torch baseline unavailable:", exc)
    for f in ("e4m3", "e5m2", "hif8"):
        for path in ("bits", "lut"):
            tt = timeit(lambda: G.encode(x, f, path=path))
            rows.append((f"encode f32->{f} [{path}]", 5 * n / tt, None))
        tt = timeit(lambda: G.encode(x, f, rounding="stochastic", seed=1))
        rows.append((f"encode f32->{f} [stochastic]", 5 * n / tt, None))
    xb = cp.asarray(rng.standard_normal(n // 2)).astype(cp.float16)
    rows.append(("encode f16->e4m3", 3 * xb.size / timeit(lambda: G.encode(xb, "e4m3")), None))
    for f in ("e4m3", "e5m2", "hif8"):
        cf = G.encode(x, f)
        rows.append((f"decode {f}->f32", 5 * n / timeit(lambda: G.decode(cf, f)), None))
        rows.append((f"decode {f}->f16", 3 * n / timeit(lambda: G.decode(cf, f, dtype="float16")), None))
    log(f"\n{'codec (2^28 elements)':34s} {'GB/s':>8s} {'/copy':>6s} {'/torch':>7s}")
    out = []
    for name, bw, _ in rows:
        log(f"{name:34s} {bw / 1e9:8.0f} {bw / copy_bw:6.3f} " + (f"{bw / torch_bw:7.3f}" if torch_bw else ""))
        out.append({"name": name, "GBps": bw / 1e9, "vs_copy": bw / copy_bw,
                    "vs_torch": bw / torch_bw if torch_bw else None})
    res["bandwidth"] = out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--codecs", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--gemm", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)
    import fp8lab.gpu
    ok, why = fp8lab.gpu.available()
    log("device:", why)
    if not ok:
        sys.exit(1)
    rng = np.random.default_rng()
    res = {"device": why, "date": time.strftime("%Y-%m-%d")}
    try:
        if a.codecs:
            check_codecs(rng, res)
        if a.bench:
            bench_codecs(rng, res)
        if a.gemm:
            import gpu_gemm
            gpu_gemm.run(rng, res, log)
    finally:
        with open(os.path.join(a.out, "gpu_check.json"), "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        with open(os.path.join(a.out, "gpu_check.log"), "w") as fh:
            fh.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
