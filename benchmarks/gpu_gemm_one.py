"""Three calls of one plain GPU GEMM (bfloat16 out), for ncu (``-s 2 -c 1`` profiles the third).

    PYTHONPATH=. python3 benchmarks/gpu_gemm_one.py 65536x1024x1024 [e4m3|hif8] [tensor|block]
        [--wide auto|always|never]
"""
import argparse

import cupy as cp

import fp8lab.gpu.codecs as G
import fp8lab.gpu.gemm as GM

ap = argparse.ArgumentParser()
ap.add_argument("shape")
ap.add_argument("fmt", nargs="?", default="e4m3")
ap.add_argument("scaling", nargs="?", default="tensor", choices=GM.SCALINGS)
ap.add_argument("--wide", default="auto", choices=("auto", "always", "never"))
a = ap.parse_args()
GM.WIDE_TILES = a.wide
M, N, K = (int(v) for v in a.shape.split("x"))
x = G.encode(cp.random.standard_normal((M, K), dtype=cp.float32), a.fmt, saturate=True)
w = G.encode(cp.random.standard_normal((N, K), dtype=cp.float32), a.fmt, saturate=True)
kb = -(-K // GM.BLOCK)
sa, sb = ((cp.ones((M, kb), cp.float32), cp.ones((-(-N // GM.BLOCK), kb), cp.float32))
          if a.scaling == "block" else (1.0, 1.0))
out = cp.empty((M, N), cp.uint16)
for _ in range(3):
    GM.gemm(x, w, a.fmt, scale_a=sa, scale_b=sb, scaling=a.scaling, out_dtype="bfloat16", out=out)
cp.cuda.runtime.deviceSynchronize()
print("done", a, GM.last_kernel)
