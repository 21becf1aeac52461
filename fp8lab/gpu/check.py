"""Exhaustive GPU self-checks (all 2^32 float32 inputs), run by benchmarks/gpu_check.py."""

from __future__ import annotations

import numpy as np

from .. import _kernels as K
from ..codecs import _lut
from ..formats import get_format
from . import _loader
from .codecs import _device_table, _sm_count

__all__ = ["check_float32_all"]


def _instance(mode: str, sat: bool) -> str:
    return f"fp8_check_f32_all<{K.MODE_CODES[mode]}, {'true' if sat else 'false'}>"


def _instances() -> list[str]:
    return [_instance(m, s) for m in K.MODE_CODES if m != "stochastic" for s in (False, True)]


def check_float32_all(fmt, mode: str, saturate: bool) -> dict:
    """Mismatch counts of the three device float32 paths against the CPU table, all 2^32 inputs."""
    import cupy as cp

    f = get_format(fmt)
    lut = _device_table(("lut", f.name, mode, bool(saturate)), lambda: _lut(f, "float32", mode, bool(saturate)))
    k = _loader.kernel("codec_check.cu", _instance(mode, saturate), _loader.format_defines(f))
    k.max_dynamic_shared_size_bytes = 1 << 17
    mism = cp.zeros(3, cp.uint64)
    first = cp.full(3, 0xFFFFFFFF, cp.uint32)
    k((_sm_count(),), (1024,), (lut, np.uint64(0), np.uint64(1 << 32), mism, first), shared_mem=1 << 17)
    m, fi = mism.get(), first.get()
    names = ("f32_bits", "generic_f32", "generic_f64")
    return {n: (int(m[i]), int(fi[i]) if m[i] else None) for i, n in enumerate(names)}
