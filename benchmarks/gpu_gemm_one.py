"""Three calls of one plain GPU GEMM (bfloat16 out), for ncu (``-s 2 -c 1`` profiles the third).

    PYTHONPATH=. python3 benchmarks/gpu_gemm_one.py 65536x1024x1024 [e4m3|hif8] [tensor|row_col|block]
        [--wide auto|always|never] [--wide-fp8 auto|192|256] [--build "WG_PF=8,..."]

Operands and scales are made as gpu_gemm.py's benchmarks make them. ``--build``: defines put in
front of gemm_wgmma.cu's source, as a build of gpu_ab.py.
"""
import argparse

import cupy as cp

import fp8lab.gpu.codecs as G
import fp8lab.gpu.gemm as GM
from gpu_gemm import _codes, _make_scales

ap = argparse.ArgumentParser()
ap.add_argument("shape")
ap.add_argument("fmt", nargs="?", default="e4m3")
ap.add_argument("scaling", nargs="?", default="tensor", choices=GM.SCALINGS)
ap.add_argument("--wide", default="auto", choices=("auto", "always", "never"))
ap.add_argument("--wide-fp8", default="auto", choices=("auto", "192", "256"),
                help="width of the FP8 wide tiles (gemm.WIDE_FP8), to profile two scalings on one tile")
ap.add_argument("--build", default="")
a = ap.parse_args()
GM.WIDE_TILES = a.wide
GM.WIDE_FP8 = a.wide_fp8 if a.wide_fp8 == "auto" else int(a.wide_fp8)
if a.build:
    import gpu_ab
    gpu_ab.use("build", gpu_ab.parse_builds("build=" + a.build)["build"])
M, N, K = (int(v) for v in a.shape.split("x"))
x, w = _codes(cp, G, (M, K), a.fmt), _codes(cp, G, (N, K), a.fmt)
sa, sb = _make_scales(cp, a.scaling, M, N, K)
out = cp.empty((M, N), cp.uint16)
for _ in range(3):
    GM.gemm(x, w, a.fmt, scale_a=sa, scale_b=sb, scaling=a.scaling, out_dtype="bfloat16", out=out)
cp.cuda.runtime.deviceSynchronize()
print("done", a, GM.last_kernel)
