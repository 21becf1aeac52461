"""Host time per call of the GPU entry points, side by side with torch (run on the H200).

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_host.py [--profile]

A call's host time is paid in full whenever the GPU's queue is empty: one call at a time, and
every call of a small product (whose kernel runs for a few microseconds). Each row is the
median over 5 rounds of the wall time of 1000 calls back to back on a 128x128x128 product
(its kernel is shorter than the host time, so the launches never wait for the queue to drain),
divided by 1000: fp8lab's gemm and gemm_fused, torch._scaled_mm (cuBLASLt), and an empty CuPy
RawKernel with as many arguments as gemm_wgmma (the floor of a CuPy launch). --profile: the
functions where gemm's (out given and allocated) and gemm_fused's calls spend their time (cProfile, 2000 calls each).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

_EMPTY = r"""extern "C" __global__ void empty29(const void* a, void* b, int c, int d, int e, int f,
    const float* g, const float* h, int i, int j, int k, int l, float* m, const int* n, const void* o,
    long long p, unsigned q, unsigned r, unsigned* s, const float* t, int u, const float* v,
    unsigned w, unsigned x, unsigned* y, unsigned char* z, int z1, unsigned* z2, int z3) {}"""


def _host_us(cp, fn, n=1000, rounds=5):
    for _ in range(20):
        fn()
    cp.cuda.get_current_stream().synchronize()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n)
        cp.cuda.get_current_stream().synchronize()
    return float(np.median(ts)) * 1e6


def _calls(M=128, N=128, K=128):
    import cupy as cp
    import torch
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu.gemm import gemm, gemm_fused
    a = G.encode(cp.random.standard_normal((M, K), dtype=cp.float32), "e4m3", saturate=True)
    b = G.encode(cp.random.standard_normal((N, K), dtype=cp.float32), "e4m3", saturate=True)
    xb = cp.random.standard_normal((M, K), dtype=cp.float32).astype(cp.float16)
    out = cp.empty((M, N), cp.uint16)
    sa = cp.full((1,), 0.5, cp.float32)
    ta = torch.from_dlpack(a).view(torch.float8_e4m3fn)
    tb = torch.from_dlpack(b).view(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    k = cp.RawKernel(_EMPTY, "empty29")
    p = cp.empty(1, cp.float32)
    args = (p, p, np.int32(1), np.int32(1), np.int32(1), np.int32(1), p, p, np.int32(1), np.int32(1),
            np.int32(1), np.int32(1), p, p, p, np.int64(0), np.uint32(0), np.uint32(0), p, p,
            np.int32(0), p, np.uint32(0), np.uint32(0), p, p, np.int32(0), p, np.int32(0))
    return {
        "fp8lab gemm (e4m3, bf16 out, out given)": lambda: gemm(a, b, "e4m3", out_dtype="bfloat16", out=out),
        "fp8lab gemm (scale on the device)": lambda: gemm(a, b, "e4m3", scale_a=sa, out_dtype="bfloat16", out=out),
        "fp8lab gemm (out allocated)": lambda: gemm(a, b, "e4m3", out_dtype="bfloat16"),
        "fp8lab gemm_fused (fp16 A, check=False)": lambda: gemm_fused(xb, b, "e4m3", scale_a=sa, out_dtype="bfloat16",
                                                                      out=out, check=False),
        "torch._scaled_mm (cuBLASLt)": lambda: torch._scaled_mm(ta, tb.t(), scale_a=one, scale_b=one,
                                                              out_dtype=torch.bfloat16),
        "CuPy RawKernel, 29 arguments, empty": lambda: k((1,), (32,), args),
    }


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true", help="cProfile of gemm and gemm_fused calls")
    a = ap.parse_args(argv)
    import cupy as cp
    calls = _calls()
    print(f"{'entry point':<44s} {'host us per call':>16s}")
    for name, fn in calls.items():
        print(f"{name:<44s} {_host_us(cp, fn):16.1f}")
    if a.profile:
        import cProfile
        import pstats
        for name in ("fp8lab gemm (e4m3, bf16 out, out given)", "fp8lab gemm (out allocated)",
                     "fp8lab gemm_fused (fp16 A, check=False)"):
            fn = calls[name]
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(2000):
                fn()
            pr.disable()
            cp.cuda.get_current_stream().synchronize()
            print(f"\n== {name}: 2000 calls")
            pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
