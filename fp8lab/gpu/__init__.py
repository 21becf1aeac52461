"""GPU (CuPy) codecs and GEMMs.

CUDA sources live in the package data folder ``gpu/`` and are compiled at run time by one loader
(:mod:`fp8lab.gpu._loader`) with NVRTC (through CuPy's binding; float32 subnormals kept, never
``-ftz=true``), cached on disk and memoized per device and template instance. fp8lab itself
never needs CuPy: :func:`available` says whether this module can run and, if not, why.

>>> import fp8lab.gpu
>>> ok, reason = fp8lab.gpu.available()
>>> isinstance(ok, bool) and isinstance(reason, str)
True
"""

from __future__ import annotations

import functools

__all__ = ["available", "encode", "decode", "MIN_CC"]  # GEMM: fp8lab.gpu.gemm.gemm

#: Compute capability the kernels are built for (sm_90a: wgmma, Hopper).
MIN_CC = (9, 0)


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    """``(True, device description)`` if the GPU kernels can run here, else ``(False, why not)``."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc}); install fp8lab[gpu]"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no CUDA device usable by CuPy ({type(exc).__name__}: {exc})"
    if n == 0:
        return False, "no CUDA device found"
    dev = cupy.cuda.Device()
    cc = tuple(int(c) for c in dev.compute_capability)
    if cc != MIN_CC:
        return False, (f"device {dev.id} has compute capability {cc[0]}.{cc[1]}; fp8lab's GPU "
                       f"kernels are built for sm_90a (Hopper: H100/H200)")
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return True, f"device {dev.id}: {name} (sm_90a)"


def __getattr__(name):  # lazy: importing fp8lab.gpu never imports CuPy
    if name in ("encode", "decode"):
        from . import codecs
        return getattr(codecs, name)
    raise AttributeError(f"module 'fp8lab.gpu' has no attribute {name!r}")
