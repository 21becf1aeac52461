"""Quantized collectives: all-reduce, reduce-scatter and all-gather with 8-bit messages.

Each message carries 8-bit codes (any registered format) with one float32 scale per block;
receivers decode and accumulate in float32. Ring and tree schedules are explicit step lists
(:mod:`.schedule`) run by the same per-rank program on the CPU (:mod:`.emulate`, N ranks with NumPy)
and on GPUs (:mod:`.nccl`, one process per GPU through ``cupy.cuda.nccl``), so both give the same
bits. :mod:`.analysis` predicts and measures the error against a float64 sum.

Importing this package imports neither CuPy nor Numba.

>>> import numpy as np
>>> from fp8lab.collectives import Compression, emulate
>>> rng = np.random.default_rng(0)
>>> xs = rng.standard_normal((4, 1000)).astype(np.float32)
>>> out = emulate.all_reduce(xs, Compression("e5m2", block=128), algo="tree")
>>> out.shape, bool((out == out[0]).all())
((4, 1000), True)
"""

from __future__ import annotations

from .schedule import Schedule, Step, Transfer, build_schedule, chunk_bounds
from .wire import Compression, derive_seed

__all__ = ["Compression", "derive_seed", "Schedule", "Step", "Transfer", "build_schedule",
           "chunk_bounds", "emulate", "analysis", "nccl"]


def __getattr__(name):  # submodules on first use
    if name in ("emulate", "analysis", "nccl"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
