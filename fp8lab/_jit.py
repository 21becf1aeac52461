"""The one JIT policy of fp8lab's CPU kernels.

``cache=True`` (compiled machine code is kept on disk, so only the first call after an install
compiles), never ``fastmath`` (codecs must be exact), ``nogil`` so callers may use threads.
Kernels take format constants as arguments, never as module globals: Numba's cache freezes
globals and would miss an edited declaration.
"""

from __future__ import annotations

__all__ = ["jit", "PARALLEL_MIN"]

#: Arrays with fewer elements run on one thread (thread start-up costs more than it saves).
PARALLEL_MIN = 1 << 16


def jit(fn=None, *, parallel: bool = False, inline: str = "never"):
    """``numba.njit`` with fp8lab's policy. Compiles lazily, on first call, never at import."""
    import numba  # imported by the kernel modules only, so that ``import fp8lab`` stays light

    deco = numba.njit(cache=True, nogil=True, fastmath=False, parallel=parallel,
                      error_model="numpy", inline=inline)
    return deco if fn is None else deco(fn)
