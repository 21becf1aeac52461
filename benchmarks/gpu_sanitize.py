"""Small launches of every GPU kernel family for compute-sanitizer (memcheck / racecheck).

    PYTHONPATH=.:benchmarks compute-sanitizer --tool memcheck python3 benchmarks/gpu_sanitize.py

Encode (cvt, lut32, generic float64 and stochastic paths), decode, quantize (fused cast: per
tensor, per row, ragged blocks, a scale below 2^-60), cast_transpose (ragged tiles, strided rows)
and the GEMM check at two ragged shapes, on
sizes that exercise the vector part, the scalar tail and misaligned starts.
"""

from __future__ import annotations

import sys

import numpy as np


def main() -> int:
    import cupy as cp

    import fp8lab
    import fp8lab.gpu.codecs as G
    import gpu_gemm
    from fp8lab.gpu.quantize import quantize

    rng = np.random.default_rng(1)
    x = rng.standard_normal(100_003).astype(np.float32)
    xd = cp.asarray(x)
    bad = 0
    for fmt in ("e4m3", "e5m2", "hif8"):
        for rounding in (None, "toward_zero", "stochastic"):
            seed = 3 if rounding == "stochastic" else None
            for arr in (xd, xd[1:], xd.astype(cp.float64)):
                got = G.encode(arr, fmt, rounding=rounding, seed=seed).get()
                ref = fp8lab.encode(cp.asnumpy(arr), fmt, rounding=rounding, seed=seed)
                bad += int((got != ref).sum())
        codes = G.encode(xd, fmt)
        bad += int((G.decode(codes, fmt).get().view(np.uint32)
                    != fp8lab.decode(codes.get(), fmt).view(np.uint32)).sum())
    for fmt in ("e4m3", "hif8"):
        for shape, rec in (((300, 333), "tensor"), ((300, 333), "channel"), ((300, 333), "block"),
                           ((1000,), "block:64")):
            xs = (rng.standard_normal(shape) * 2.0**-70).astype(np.float32)
            for arr in (xs, xs * np.float32(2.0**70)):
                got = quantize(cp.asarray(arr), fmt, scaling=rec)
                ref = fp8lab.quantize(arr, fmt, scaling=rec)
                bad += int((got.codes.get() != ref.codes).sum())
    # cast_transpose: ragged tiles, strided rows, float16, the table and cvt kernels
    import gpu_quantize
    bad += gpu_quantize.check_cast_transpose(print, shapes=((63, 65), (130, 67)))
    print(f"codecs and quantize: {bad} mismatches")
    # 70x136x2100: the TMA-store epilogue (16-bit outputs) and split-K (4 splits) with its reduce
    bad += gpu_gemm.check(print, shapes=((70, 130, 200), (70, 136, 2100)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
