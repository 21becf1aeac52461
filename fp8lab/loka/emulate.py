"""Scaled fake-quantization and the GEMM emulation LoKA measures errors with.

The probe must measure each candidate exactly as the prediction models it, whatever the state of
other modules, so the recipes live here: group amax, scale (``amax / fmax``, or a power of two:
``2^ceil(log2(amax / fmax))``, which never overflows, and for MX the E8M0 rule
``2^(floor(log2 amax) - emax)`` of the OCP MX spec, which may saturate), then the exact codec of
:func:`fp8lab.encode` / :func:`fp8lab.decode`.

>>> import numpy as np
>>> from fp8lab.loka.emulate import fake_quant
>>> fake_quant(np.array([[1.0, 0.3]]), "e4m3", "tensor").tolist()
[[1.0, 0.2857142857142857]]
"""

from __future__ import annotations

import math

import numpy as np

from ..codecs import decode, encode
from ..formats import get_format
from .sites import block_shape

__all__ = ["group_amax", "scales_for", "fake_quant", "emulate_gemm", "apply_follow"]


def _block_reduce_max(a: np.ndarray, bs: tuple[int, int]) -> np.ndarray:
    """Max of ``a`` (2-D, non-negative) over (bs[0] x bs[1]) blocks, padded with zeros."""
    r, c = a.shape
    br, bc = min(bs[0], r), bs[1]
    pr, pc = -r % br, -c % bc
    if pr or pc:
        a = np.pad(a, ((0, pr), (0, pc)))
    R, C = a.shape
    return a.reshape(R // br, br, C // bc, bc).max(axis=(1, 3)), (br, bc)


def group_amax(absx: np.ndarray, gran: str) -> np.ndarray:
    """Per-element amax of its scaling group, broadcastable to ``absx`` (2-D, already |x|)."""
    if gran == "tensor":
        return np.array([[absx.max(initial=0.0)]])
    if gran == "channel":
        return absx.max(axis=1, keepdims=True, initial=0.0)
    bs = block_shape(gran)
    blk, (br, bc) = _block_reduce_max(absx, bs)
    full = np.repeat(np.repeat(blk, br, axis=0), bc, axis=1)
    return full[: absx.shape[0], : absx.shape[1]]


def scales_for(amax, fmt, *, pow2: bool = False, mx: bool = False) -> np.ndarray:
    """Scale per group (quantized value = x / scale). Zero groups get scale 1."""
    f = get_format(fmt)
    fmax = f.finfo.max if mx else f.finfo.scale_target  # amax maps to the scale target
    amax = np.asarray(amax, dtype=np.float64)
    safe = np.where(amax > 0, amax, 1.0)
    if mx:
        emax = math.floor(math.log2(fmax))
        s = np.exp2(np.floor(np.log2(safe)) - emax)
    elif pow2:
        s = np.exp2(np.ceil(np.log2(safe / fmax)))
    else:
        s = safe / fmax
    return np.where(amax > 0, s, 1.0)


def fake_quant(x, fmt, gran: str = "tensor", *, pow2: bool = False, amax=None,
               rounding=None, seed=None) -> np.ndarray:
    """Quantize-dequantize ``x`` (2-D) in float64 with the given recipe.

    ``amax`` overrides the per-tensor amax (delayed scaling: the scale comes from history); values
    beyond the format's range then saturate to +-max.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"operands are 2-D (rows x K), got shape {x.shape}")
    absx = np.abs(x)
    if amax is not None:
        if gran != "tensor":
            raise ValueError("an amax override (delayed scaling) needs gran='tensor'")
        ga = np.array([[float(amax)]])
    else:
        ga = group_amax(absx, gran)
    s = scales_for(ga, fmt, pow2=pow2, mx=(gran == "mx"))
    codes = encode(x / s, fmt, saturate=True, rounding=rounding, seed=seed)
    return decode(codes, fmt, dtype=np.float64) * s


def emulate_gemm(a, b, cand, *, amax_a=None, amax_b=None, seed=None) -> np.ndarray:
    """``C = Q(A) @ Q(B).T`` for candidate ``cand`` (float64 result).

    ``accumulate='exact'`` sums in float64 (exact for 8-bit products up to K ~ 2^20 with
    per-tensor/channel scales); ``'fp32'`` sums in float32, as tensor-core kernels do.
    """
    if cand.is_high:
        return np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
    qa = fake_quant(a, cand.fmt_a, cand.scaling, pow2=cand.pow2, amax=amax_a, seed=seed)
    qb = fake_quant(b, cand.fmt_b, cand.scaling, pow2=cand.pow2, amax=amax_b, seed=seed)
    if cand.accumulate == "fp32":
        return (qa.astype(np.float32) @ qb.astype(np.float32).T).astype(np.float64)
    return qa @ qb.T


def apply_follow(c: np.ndarray, follow: str, eps: float = 0.0) -> np.ndarray:
    """The operation after the GEMM, without affine parameters (they scale error and signal alike)."""
    if follow == "none":
        return c
    if follow == "relu":
        return np.maximum(c, 0.0)
    if follow == "layernorm":
        d = c - c.mean(axis=1, keepdims=True)
        return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + eps)
    if follow == "rmsnorm":
        return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + eps)
    raise ValueError(f"unknown follow {follow!r}")
