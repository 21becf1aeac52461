"""The kernel registry: every GEMM kernel LoKA may dispatch to, with what it supports and why not.

A kernel is data: formats, scalings, shape constraints, device, whether it fuses the cast of its
operands, and (CPU kernels) the callables the performance database times. GPU kernels live in
``fp8lab.gpu``; when that module reports no GPU they stay listed and say why they are unavailable.

>>> from fp8lab.loka.kernels import registry
>>> [k.name for k in registry()][:2]
['numpy-f64', 'numpy-fp8-sim']
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from ..codecs import decode, encode
from .emulate import group_amax, scales_for
from .sites import HIGH, Candidate, Site

__all__ = ["Kernel", "registry", "get_kernel", "gpu_status"]


def gpu_status() -> tuple[bool, str]:
    """(available, reason) as ``fp8lab.gpu`` reports it."""
    try:
        from .. import gpu
    except Exception as exc:  # noqa: BLE001 - any import failure means no GPU path
        return False, f"fp8lab.gpu failed to import ({type(exc).__name__}: {exc})"
    for name in ("available", "is_available", "gpu_available"):
        fn = getattr(gpu, name, None)
        if callable(fn):
            try:
                res = fn()
            except Exception as exc:  # noqa: BLE001
                return False, f"fp8lab.gpu.{name}() raised {type(exc).__name__}: {exc}"
            if isinstance(res, tuple):
                return bool(res[0]), str(res[1]) if len(res) > 1 else ""
            reason = getattr(gpu, "unavailable_reason", None)
            reason = reason() if callable(reason) else (reason or "fp8lab.gpu reports no GPU")
            return bool(res), "" if res else str(reason)
    return False, "fp8lab.gpu reports no GPU (it has no available() check yet)"


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One GEMM kernel.

    ``formats``: 8-bit formats it computes with (``("high",)`` for a high-precision kernel);
    ``scalings``: granularities it applies (``None``: any); ``align_k``: K must be a multiple;
    ``fuses_cast``: it reads high-precision operands and casts inside (no separate cast cost).
    """

    name: str
    device: str
    formats: tuple[str, ...]
    scalings: tuple[str, ...] | None
    description: str
    fuses_cast: bool = False
    align_k: int = 1
    min_dim: int = 1
    gemm: Callable | None = dataclasses.field(default=None, repr=False, compare=False)
    cast: Callable | None = dataclasses.field(default=None, repr=False, compare=False)

    def available(self) -> tuple[bool, str]:
        if self.device == "cpu":
            return True, ""
        ok, why = gpu_status()
        return ok, ("" if ok else f"unavailable: {why}")

    def supports(self, site: Site, cand: Candidate) -> str | None:
        """``None`` if the kernel can run ``cand`` at ``site``, else the reason it cannot."""
        if cand.is_high != (self.formats == (HIGH,)):
            return "high-precision kernel" if self.formats == (HIGH,) else "8-bit kernel"
        if not cand.is_high:
            for f in (cand.fmt_a, cand.fmt_b):
                if f not in self.formats:
                    return f"format {f} not supported (supports {', '.join(self.formats)})"
            if self.scalings is not None and cand.scaling not in self.scalings:
                return f"scaling {cand.scaling} not supported (supports {', '.join(self.scalings)})"
        if site.k % self.align_k:
            return f"K={site.k} is not a multiple of {self.align_k}"
        if min(site.m, site.n, site.k) < self.min_dim:
            return f"a dimension is below {self.min_dim}"
        return None


def _f64_gemm(a, b):
    return a @ b.T


def _f32_gemm(a, b):
    return a @ b.T


def _sim_cast(x, fmt, gran, pow2):
    """The cast a CPU pipeline pays: float32 operand -> codes (float32 LUT path) -> float32."""
    g = group_amax(np.abs(x), gran)
    s = scales_for(g, fmt, pow2=pow2, mx=(gran == "mx")).astype(np.float32)
    return decode(encode(x / s, fmt, saturate=True), fmt) * s


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


def _gpu_gemm(a, b, *, kernel, fmt):
    """``a``, ``b``: CuPy uint8 codes at the bucket shape; per-tensor scales."""
    from ..gpu.gemm import gemm

    out = gemm(a, b, fmt, scale_a=1.0, scale_b=1.0, scaling="tensor", layout="nt", kernel=kernel)
    _sync()
    return out


def _gpu_f32(a, b):
    out = a @ b.T
    _sync()
    return out


def _gpu_cast(x, fmt, gran, pow2):
    """float32 CuPy operand -> amax -> scale -> codes (what a GPU pipeline pays per operand)."""
    import cupy

    from ..gpu import encode as gpu_encode

    ax = cupy.abs(x)
    amax = ax.max() if gran == "tensor" else ax.max(axis=1, keepdims=True)
    fmax = float(__import__("fp8lab").finfo(fmt).scale_target)
    s = cupy.where(amax > 0, amax / fmax, 1.0).astype(cupy.float32)
    if pow2:
        s = cupy.exp2(cupy.ceil(cupy.log2(s)))
    out = gpu_encode(x / s, fmt, saturate=True)
    _sync()
    return out


@functools.lru_cache(maxsize=1)
def registry() -> tuple[Kernel, ...]:
    """All kernels, CPU first."""
    from ..formats import list_formats

    fmts = tuple(list_formats())
    return (
        Kernel("numpy-f64", "cpu", (HIGH,), None,
               "float64 GEMM (the precision of a plain numpy model)", gemm=_f64_gemm),
        Kernel("numpy-fp8-sim", "cpu", fmts, None,
               "8-bit operands decoded to float32, float32 GEMM (fp32 accumulation)",
               gemm=_f32_gemm, cast=_sim_cast),
        Kernel("gpu-wgmma-fp8", "cuda", ("e4m3", "e5m2"), ("tensor", "channel"),
               "fp8lab.gpu.gemm kernel='wgmma' on e4m3/e5m2: FP8 tensor cores (Hopper wgmma), fp32 "
               "promotion every 128 K (its block recipe is 1x128 for A but 128x128 for B, not "
               "LoKA's block:128)", gemm=functools.partial(_gpu_gemm, kernel="wgmma",
                                                           fmt="e4m3"), cast=_gpu_cast),
        Kernel("gpu-wgmma-f16", "cuda", tuple(f for f in fmts if f not in ("e4m3", "e5m2")),
               ("tensor", "channel"),
               "fp8lab.gpu.gemm kernel='wgmma' on other formats: operands decoded to fp16, "
               "fp16 tensor cores",
               gemm=functools.partial(_gpu_gemm, kernel="wgmma", fmt="hif8"), cast=_gpu_cast),
        Kernel("gpu-mma-f16", "cuda", fmts, ("tensor", "channel"),
               "fp8lab.gpu.gemm kernel='mma': in-kernel decode to fp16, mma.sync (any device)",
               gemm=functools.partial(_gpu_gemm, kernel="mma", fmt="e4m3"), cast=_gpu_cast),
        Kernel("cupy-f32", "cuda", (HIGH,), None, "float32 CuPy GEMM (high precision on GPU)",
               gemm=_gpu_f32),
        Kernel("cupy-f16", "cuda", (HIGH,), None,
               "float16 CuPy (cuBLAS) GEMM: the 16-bit baseline 8-bit kernels must beat",
               gemm=_gpu_f32),
    )


def get_kernel(name: str) -> Kernel:
    for k in registry():
        if k.name == name:
            return k
    raise KeyError(f"unknown kernel {name!r}; known: {', '.join(k.name for k in registry())}")
