"""Scaled GEMMs of 8-bit operands on the GPU (CuPy raw kernels, ``gpu/gemm.cu``).

``C = (decode(A) * scale_a) @ (decode(B) * scale_b)`` with fp32 accumulation, for any pair of
fp8lab formats (each operand is decoded in the kernel to fp16, where every fp8lab value is exact,
and multiplied on fp16 tensor cores).
"""

from __future__ import annotations

import numpy as np

from ..formats import get_format
from . import _loader
from .codecs import _as_cupy, _device_table

__all__ = ["gemm", "SCALINGS", "LAYOUTS", "OUT_DTYPES"]

SCALINGS = ("tensor", "row_col", "block")
LAYOUTS = ("nt", "nn")
OUT_DTYPES = ("float32", "bfloat16", "float16")
BLOCK = 128
_TILE = (128, 128)


def _instance(layout: str, scaling: str, out: str) -> str:
    return f"fp8_gemm_f16<{LAYOUTS.index(layout)}, {SCALINGS.index(scaling)}, {OUT_DTYPES.index(out)}>"


def _instances() -> list[str]:
    return [_instance(lay, s, o) for lay in LAYOUTS for s in SCALINGS for o in OUT_DTYPES]


def _scale(s, shape, name):
    import cupy as cp
    s = cp.ascontiguousarray(cp.asarray(s, dtype=cp.float32))
    if s.size == 1 and shape == (1,):
        return s.reshape(1)
    if s.shape != shape:
        raise ValueError(f"{name} must have shape {shape} for this scaling, got {s.shape}")
    return s


def gemm(a, b, fmt_a, fmt_b=None, *, scale_a=1.0, scale_b=1.0, scaling="tensor", layout="nt",
         out_dtype="float32", out=None):
    """Scaled matrix product of 8-bit code matrices (CuPy uint8).

    Parameters
    ----------
    a : (M, K) uint8 codes of ``fmt_a``.
    b : codes of ``fmt_b`` (default ``fmt_a``): (N, K) for ``layout="nt"`` (``C = A B^T``) or
        (K, N) for ``layout="nn"`` (``C = A B``). Row-major (a row stride is allowed).
    scaling : "tensor" (scalars), "row_col" (``scale_a`` of shape (M,), ``scale_b`` (N,)) or "block"
        (``scale_a`` (M, ceil(K/128)) for 1x128 blocks of A; ``scale_b`` (ceil(N/128), ceil(K/128))
        for 128x128 blocks of B, in the (N, K) orientation whatever the layout). Block partial sums
        are promoted into the fp32 accumulator every 128 K-elements.
    out_dtype : "float32", "float16" or "bfloat16" (bfloat16 comes back as uint16 bit patterns).

    Returns
    -------
    (M, N) CuPy array.
    """
    import cupy as cp

    fa = get_format(fmt_a)
    fb = get_format(fmt_b if fmt_b is not None else fmt_a)
    if scaling not in SCALINGS:
        raise ValueError(f"unknown scaling {scaling!r}; known: {', '.join(SCALINGS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"unknown out_dtype {out_dtype!r}; known: {', '.join(OUT_DTYPES)}")
    a, b = _as_cupy(a), _as_cupy(b)
    for name, x in (("a", a), ("b", b)):
        if x.dtype != cp.uint8 or x.ndim != 2:
            raise TypeError(f"{name} must be a 2-D uint8 CuPy array of codes, got {x.dtype} {x.shape}")
        if x.strides[1] != 1:
            raise ValueError(f"{name} must be row-major (unit stride along its last axis)")
    M, K = a.shape
    N, Kb = (b.shape if layout == "nt" else b.shape[::-1])
    if Kb != K:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape} ({layout})")
    kb = -(-K // BLOCK)
    if scaling == "tensor":
        sa, sb = _scale(scale_a, (1,), "scale_a"), _scale(scale_b, (1,), "scale_b")
    elif scaling == "row_col":
        sa, sb = _scale(scale_a, (M,), "scale_a"), _scale(scale_b, (N,), "scale_b")
    else:
        sa, sb = _scale(scale_a, (M, kb), "scale_a"), _scale(scale_b, (-(-N // BLOCK), kb), "scale_b")
    odt = cp.uint16 if out_dtype == "bfloat16" else cp.dtype(out_dtype)
    if out is None:
        out = cp.empty((M, N), odt)
    elif out.shape != (M, N) or out.dtype != odt or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous ({M}, {N}) array of {odt}")
    if M == 0 or N == 0:
        return out
    ta = _device_table(("dec", fa.name, "float16"), lambda: np.ascontiguousarray(fa.decode_table("float16")).view(np.uint16))
    tb = _device_table(("dec", fb.name, "float16"), lambda: np.ascontiguousarray(fb.decode_table("float16")).view(np.uint16))
    k = _loader.kernel("gemm.cu", _instance(layout, scaling, out_dtype))
    grid = (-(-N // _TILE[1]), -(-M // _TILE[0]))
    k(grid, (256,), (a, b, out, np.int32(M), np.int32(N), np.int32(K), np.int32(a.strides[0]),
                     np.int32(b.strides[0]), np.int32(N), ta, tb, sa, sb, np.int32(kb)))
    return out
