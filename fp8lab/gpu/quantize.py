"""Scaled quantization of CuPy arrays: the same codes and scales as :func:`fp8lab.quantize`.

Steps, each on the GPU except the scale rule: (1) block maxima of ``|x|`` over finite elements
(one CuPy reduction over the blocks of :func:`fp8lab.qtensor._geometry`; exact: a maximum never
rounds); (2) the scales from those maxima by the CPU's own rule (:func:`fp8lab.scaling.compute_scale`,
a few values per block, copied to the host and back); (3) ``q = fl64(x / s)`` in float64 on the
GPU (IEEE division, as the CPU does it) and ``code = encode(q)`` by :func:`fp8lab.gpu.encode`'s
float64 path, which is bit-identical to :func:`fp8lab.encode` (``docs/gpu.md``). Stochastic
rounding keys element ``i``'s random bits by its C-order index, as the CPU does.

Not fused yet: the float64 quotient is materialized (13 bytes of traffic per float32 element more
than a fused kernel), and the scale rule runs on the host.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..formats import Format
from ..scaling import Scaling, compute_scale

__all__ = ["quantize", "GPUQTensor"]


@dataclasses.dataclass(frozen=True, eq=False)
class GPUQTensor:
    """Codes (uint8) and float32 scales as CuPy arrays, with the format and recipe."""

    codes: object
    scales: object
    format: Format
    scaling: Scaling
    dtype: np.dtype

    def get(self):
        """The host :class:`fp8lab.QTensor`."""
        from ..qtensor import QTensor
        return QTensor(self.codes.get(), self.scales.get(), self.format, self.scaling, dtype=self.dtype)


_kernels: dict = {}
_CHUNK = 1 << 16
#: one-pass block maxima (_block_amax). Off: its bit-identity check against fp8lab.quantize has not
#: completed on a GPU yet (benchmarks/gpu_codecs_v3.py quantize step); the composed path stays.
FUSED_AMAX = False


def _absmax_kernel(cp):
    """max over finite |x| as float64 (exact: |x| and the widening are exact, a maximum never
    rounds; Inf/NaN count as 0, as in the CPU's block maxima)."""
    k = _kernels.get("absmax")
    if k is None:
        k = _kernels["absmax"] = cp.ReductionKernel(
            "T x", "float64 y", "isfinite(x) ? fabs((double)x) : 0.0", "max(a, b)", "y = a", "0.0",
            "fp8lab_finite_absmax", reduce_type="double")
    return k


def _block_amax(cp, x3, P, nbR, BR, nbC, BC):
    """(P, nbR, nbC) float64 block maxima of finite |x| for float32/float64 x3 = (P, R, C) whose
    blocks tile it exactly: one fused pass (no |x|, isfinite or float64 temporaries). A single
    block per slice (per-tensor scaling) is reduced in two stages, (P, m, 2^16) -> (P, m) -> (P,):
    a reduction with few outputs runs on few thread blocks."""
    k = _absmax_kernel(cp)
    if nbR == 1 and nbC == 1:
        n = BR * BC
        x2 = x3.reshape(P, n)
        if n % _CHUNK == 0 and n >= 4 * _CHUNK:
            part = k(x2.reshape(P, n // _CHUNK, _CHUNK), axis=2)
            return k(part, axis=1).reshape(P, 1, 1)
        return k(x2, axis=1).reshape(P, 1, 1)
    return k(x3.reshape(P, nbR, BR, nbC, BC), axis=(2, 4))


def quantize(x, fmt, *, scaling=None, rounding=None, saturate=None, seed=None, scales=None) -> GPUQTensor:
    """:func:`fp8lab.quantize` for a CuPy array ``x`` (float64, float32 or float16): same
    arguments, same codes and scales bit for bit; returns a :class:`GPUQTensor`."""
    import cupy as cp

    from ..qtensor import _geometry, _resolve_call
    from .codecs import _as_cupy, encode

    f, sc, delayed, mode, saturate = _resolve_call(fmt, scaling, rounding, saturate, seed)
    x = _as_cupy(x)
    if x.dtype not in (cp.float64, cp.float32, cp.float16):
        raise TypeError(f"x must be a float64, float32 or float16 CuPy array, got {x.dtype}")
    src_dtype = np.dtype(x.dtype)
    shape = x.shape
    sshape = sc.scale_shape(shape)
    P, R, C, BR, BC = _geometry(shape, sc)
    nbR, nbC = -(-R // BR), -(-C // BC)
    x3 = cp.ascontiguousarray(x).reshape(P, R, C)
    if delayed is not None and scales is None:
        s = delayed.compute_scale(f)
        if s is not None:
            scales = np.full(sshape, s, np.float32)
    if x.size == 0:
        return GPUQTensor(cp.empty(shape, cp.uint8), cp.ones(sshape, cp.float32), f, sc, src_dtype)
    if scales is not None:
        s_host = np.asarray(scales.get() if isinstance(scales, cp.ndarray) else scales, np.float32)
        if s_host.shape != tuple(sshape):
            raise ValueError(f"scales must have shape {tuple(sshape)}, got {s_host.shape}")
        if not (np.isfinite(s_host).all() and (s_host > 0).all()):
            raise ValueError("scales must be finite and > 0")
    elif FUSED_AMAX and x.dtype != cp.float16 and (nbR * BR, nbC * BC) == (R, C):
        amax = _block_amax(cp, x3, P, nbR, BR, nbC, BC)
        s_host = compute_scale(amax.get(), f, sc)
    else:
        a = cp.abs(x3)
        a = cp.where(cp.isfinite(a), a, 0).astype(cp.float64)
        if (nbR * BR, nbC * BC) != (R, C):
            pad = cp.zeros((P, nbR * BR, nbC * BC), cp.float64)
            pad[:, :R, :C] = a
            a = pad
        amax = a.reshape(P, nbR, BR, nbC, BC).max(axis=(2, 4))
        s_host = compute_scale(amax.get(), f, sc)
    S = cp.asarray(np.ascontiguousarray(s_host, np.float32)).reshape(P, nbR, nbC).astype(cp.float64)
    if nbR == 1 and nbC == 1:
        q = x3.astype(cp.float64) / S.reshape(P, 1, 1)
    else:
        s_el = S[:, cp.arange(R) // BR][:, :, cp.arange(C) // BC]
        q = x3.astype(cp.float64) / s_el
    codes = encode(q.reshape(shape), f.name, rounding=mode, saturate=bool(saturate), seed=seed)
    return GPUQTensor(codes, cp.asarray(np.ascontiguousarray(s_host, np.float32)).reshape(sshape), f, sc,
                      src_dtype)
