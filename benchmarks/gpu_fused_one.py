"""One gemm_fused call of a given shape (bfloat16 A, power-of-two or other scale), for ncu.

    PYTHONPATH=. python3 benchmarks/gpu_fused_one.py 16384x512x512 [--pow2]
"""
import sys

import cupy as cp
import numpy as np

import fp8lab.gpu.codecs as G
from fp8lab.gpu.gemm import gemm_fused

M, N, K = (int(v) for v in sys.argv[1].split("x"))
x = (cp.random.standard_normal((M, K), dtype=cp.float32) * 2)
xb = (x.view(cp.uint32) >> 16).astype(cp.uint16)
w = G.encode(cp.random.standard_normal((N, K), dtype=cp.float32), "e4m3", saturate=True)
s = cp.full(1, np.float32(2.0 ** -5 if "--pow2" in sys.argv else 0.0217), cp.float32)
out = cp.empty((M, N), cp.uint16)
for _ in range(3):
    gemm_fused(xb, w, "e4m3", scale_a=s, out_dtype="bfloat16", out=out, bfloat16=True, check=False)
cp.cuda.runtime.deviceSynchronize()
print("done", M, N, K)
