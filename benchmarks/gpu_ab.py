"""A/B of two builds of gpu/gemm_wgmma.cu's plain GEMM in one run: the tree's kernel against an
earlier one saved as gpu/gemm_wgmma_ab.cu (untracked; its kernel without the gtab argument).

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_ab.py

Times (CUDA graphs, GPU time) the uniform grouped GEMM (64 x 8192x256x256) and single GEMMs of
small shapes, alternating the builds, e4m3 per-tensor, bfloat16 out, and says whether the two
builds' outputs agree. Make the saved build with e.g. ``git show c592e67:gpu/gemm_wgmma.cu >
gpu/gemm_wgmma_ab.cu`` (left untracked it travels to the device with the tree) and delete it
afterwards: the nvcc test compiles every gpu/*.cu.
"""
import cupy as cp

import fp8lab.gpu.codecs as G
import fp8lab.gpu.gemm as GM
from fp8lab.gpu._cache import BoundedCache
from gpu_fused import _graph_time

import torch

_kernel = GM._loader.kernel


class _Old:
    """The saved build's kernel, launched with the tree's arguments less gtab (index 13)."""

    def __init__(self, k):
        self.k = k

    @property
    def max_dynamic_shared_size_bytes(self):
        return self.k.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, v):
        self.k.max_dynamic_shared_size_bytes = v

    def __call__(self, grid, block, args, shared_mem=0):
        return self.k(grid, block, args[:13] + args[14:], shared_mem=shared_mem)


def use(build):
    GM._plans = BoundedCache(256)
    if build == "old":
        GM._loader.kernel = lambda f, i, *d: (_Old(_kernel("gemm_wgmma_ab.cu", i, *d))
                                              if f == "gemm_wgmma.cu" and i.startswith("gemm_wgmma<")
                                              else _kernel(f, i, *d))
    else:
        GM._loader.kernel = _kernel


def main():
    g, (M, N, K) = 64, (8192, 256, 256)
    a = G.encode(cp.random.standard_normal((g, M, K), dtype=cp.float32), "e4m3", saturate=True)
    b = G.encode(cp.random.standard_normal((g, N, K), dtype=cp.float32), "e4m3", saturate=True)
    out = cp.empty((g, M, N), cp.uint16)
    cases = {"grouped 64x8192x256x256": lambda: GM.gemm_grouped(a, b, "e4m3", scale_a=1.0, scale_b=1.0,
                                                                out_dtype="bfloat16", out=out)}
    for (m, n, k) in ((8192, 256, 256), (2048, 1024, 1024), (16384, 512, 512), (8192, 8192, 8192)):
        x = G.encode(cp.random.standard_normal((m, k), dtype=cp.float32), "e4m3", saturate=True)
        y = G.encode(cp.random.standard_normal((n, k), dtype=cp.float32), "e4m3", saturate=True)
        o = cp.empty((m, n), cp.uint16)
        cases[f"gemm {m}x{n}x{k}"] = (lambda x=x, y=y, o=o: GM.gemm(x, y, "e4m3", out_dtype="bfloat16", out=o))
    res = {}
    ref = {}
    for build in ("new", "old"):
        use(build)
        for name, fn in cases.items():
            fn()
            ref.setdefault(name, []).append(cp.asnumpy(out if name.startswith("grouped") else fn()))
    for name in cases:
        same = all((r == ref[name][0]).all() for r in ref[name])
        print(f"{name}: builds agree bit for bit: {same}", flush=True)
    for rnd in range(3):
        for build in ("new", "old"):
            use(build)
            for name, fn in cases.items():
                res.setdefault((name, build), []).append(_graph_time(cp, torch, fn, reps=10, n=10))
    for name in cases:
        tn = sorted(res[(name, "new")])[1]
        to = sorted(res[(name, "old")])[1]
        print(f"{name}: tree {tn * 1e3:.4f} ms, saved build {to * 1e3:.4f} ms, tree/saved {tn / to:.3f}", flush=True)


if __name__ == "__main__":
    main()
