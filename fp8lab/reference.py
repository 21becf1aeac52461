"""The definitional codec: slow, exact, written to read like the specification.

Every fast path in fp8lab (Numba on the CPU, CUDA on the GPU) is tested bit for bit against the
functions here. Arithmetic is exact (:class:`fractions.Fraction`); there is no bit trick.

Rounding is defined over the format's value set extended by one *overflow value*: the next point of
the top binade's grid above the largest finite value (480 for E4M3, 65536 for E5M2, 1.5 * 2^15 for
HiF8). For a magnitude ``a`` let ``lo <= a <= hi`` be its neighbours in {0} + values + {overflow}:

* ``nearest_even``: the nearer one; on a tie the one that is an even multiple of ``hi - lo``
  (the grid step of ``a``'s binade, so this is IEEE's "even last digit", and a carry into the next
  binade counts as even).
* ``nearest_away``: the nearer one; on a tie ``hi``.
* ``toward_zero``: ``lo`` (so, as IEEE 754 says, a finite input never overflows: it gives max).
* ``stochastic``: ``hi`` iff ``r < (a - lo) / (hi - lo) * 2^32`` for the element's 32 random bits
  ``r`` (see :func:`random_bits`), else ``lo``.

A result equal to the overflow value (or an input at or beyond it) overflows: ``saturate=True``
gives +-max, otherwise +-Inf where the format has it, else its NaN code. NaN inputs give the
format's ``nan_encode`` code for their sign; a zero result keeps the input's sign where the format
has -0.

>>> from fp8lab.reference import encode_value, decode_code
>>> hex(encode_value(1.0625, "e4m3"))        # tie between 1.0 and 1.125: even mantissa
'0x38'
>>> hex(encode_value(1.0625, "hif8"))        # HiF8 default rounding: ties away
'0x9'
>>> decode_code(0x2E, "hif8")
Fraction(14, 1)
"""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

import numpy as np

from .formats import ROUNDING_MODES, Format, get_format

__all__ = ["decode_code", "encode_value", "encode_array", "encode_array_vectorized", "random_bits", "MASK64"]

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """The SplitMix64 finalizer (Steele, Lea, Flood 2014), on Python ints modulo 2^64."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def random_bits(seed: int, index: int) -> int:
    """The 32 random bits used to round element ``index`` (C order) under ``seed``.

    ``r = mix64(mix64(seed + golden) + (index + 1) * golden mod 2^64) >> 32``: a counter-based
    generator, so the bits depend on (seed, index) only, never on threads or chunking.

    >>> random_bits(0, 0), random_bits(0, 1), random_bits(1, 0)
    (2802244911, 3011683077, 1581361928)
    """
    key = _mix64((seed + _GOLDEN) & MASK64)
    return _mix64((key + (index + 1) * _GOLDEN) & MASK64) >> 32


def decode_code(code: int, fmt) -> "Fraction | float":
    """Exact value of ``code``: a Fraction, -0.0, nan or +-inf."""
    f = get_format(fmt)
    if not 0 <= int(code) <= 255:
        raise ValueError(f"code must be in 0..255, got {code}")
    return f.values[int(code)]


@functools.lru_cache(maxsize=None)
def _grid(f: Format) -> tuple[Fraction, ...]:
    return (Fraction(0), *f.positive_values, f.overflow_value)


def _check_mode(f: Format, rounding):
    mode = f.default_rounding if rounding is None else rounding
    if mode not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding mode {rounding!r}; known: {', '.join(ROUNDING_MODES)}")
    return mode


def encode_value(x, fmt, rounding=None, saturate: bool = False, rbits: int | None = None) -> int:
    """Encode one number exactly. ``x``: a float (any binary float as a Python float) or Fraction.

    ``rbits`` are the 32 random bits for ``stochastic`` (see :func:`random_bits`).
    """
    f = get_format(fmt)
    mode = _check_mode(f, rounding)
    if isinstance(x, Fraction):
        neg, a = x < 0, abs(x)
    else:
        x = float(x)
        if math.isnan(x):
            return f.nan_encode[1 if math.copysign(1.0, x) < 0 else 0]
        neg = math.copysign(1.0, x) < 0
        if math.isinf(x):
            return _overflow(f, neg, saturate)
        a = Fraction(abs(x))
    sign = 0x80 if neg else 0
    grid = _grid(f)
    if a >= f.overflow_value:
        r = f.overflow_value if mode != "toward_zero" else f.max_value
    else:
        i = bisect.bisect_right(grid, a) - 1
        lo = grid[i]
        if lo == a:
            r = lo
        else:
            hi = grid[i + 1]
            if mode == "toward_zero":
                r = lo
            elif mode == "stochastic":
                if rbits is None:
                    raise ValueError("stochastic rounding needs rbits")
                r = hi if rbits < (a - lo) / (hi - lo) * 2**32 else lo
            else:
                dlo, dhi = a - lo, hi - a
                if dlo != dhi:
                    r = lo if dlo < dhi else hi
                elif mode == "nearest_away":
                    r = hi
                else:
                    r = lo if (lo / (hi - lo)).numerator % 2 == 0 else hi
    if r == f.overflow_value:
        return _overflow(f, neg, saturate)
    if r == 0:
        return f.zero_codes[-1] if (neg and f.has_negative_zero) else f.zero_codes[0]
    return f.code_of[r] | sign


def _overflow(f: Format, neg: bool, saturate: bool) -> int:
    if saturate:
        return f.max_code | (0x80 if neg else 0)
    if f.inf_codes:
        return f.inf_codes[1 if neg else 0]
    return f.nan_encode[1 if neg else 0]


def encode_array(x, fmt, rounding=None, saturate=False, seed=None) -> np.ndarray:
    """Reference encode of an array (slow: for tests). Float inputs are taken at their exact value."""
    arr = np.asarray(x)
    flat = arr.reshape(-1)
    out = np.empty(flat.size, np.uint8)
    for i, v in enumerate(flat.tolist() if arr.dtype.kind == "f" and arr.dtype.itemsize >= 4
                          else flat.astype(np.float32).tolist()):
        rb = random_bits(seed, i) if seed is not None else None
        out[i] = encode_value(v, fmt, rounding, saturate, rb)
    return out.reshape(arr.shape)


def encode_array_vectorized(x, fmt, rounding=None, saturate=False, seed=None) -> np.ndarray:
    """The same definition as :func:`encode_value`, vectorized with NumPy for exhaustive tests.

    Neighbours come from ``searchsorted`` over the value grid; every comparison is exact in float64
    (differences of a value and its neighbours are exact by Sterbenz's lemma, and the stochastic
    test ``r < (a - lo) / (hi - lo) * 2^32`` is evaluated as ``r * (hi - lo) < (a - lo) * 2^32``,
    a product by a power of two). ``x``: any float array; float16/bfloat16 are taken exactly.
    """
    f = get_format(fmt)
    mode = _check_mode(f, rounding)
    arr = np.asarray(x)
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet: same code
        x64 = arr.astype(np.float64).reshape(-1)
    neg = np.signbit(x64)
    a = np.abs(x64)
    grid = np.array([float(v) for v in _grid(f)])
    ovf = float(f.overflow_value)
    i = np.clip(np.searchsorted(grid, a, side="right") - 1, 0, len(grid) - 2)
    lo, hi = grid[i], grid[i + 1]
    exact = a == lo
    with np.errstate(invalid="ignore", over="ignore"):
        if mode == "toward_zero":
            up = np.zeros(a.shape, bool)
        elif mode == "stochastic":
            idx = np.arange(a.size, dtype=np.uint64)
            r = _random_bits_np(seed, idx).astype(np.float64)
            up = r * (hi - lo) < (a - lo) * 2.0**32
        else:
            dlo, dhi = a - lo, hi - a
            tie = dlo == dhi
            if mode == "nearest_away":
                tie_up = np.ones(a.shape, bool)
            else:
                tie_up = np.mod(lo / (hi - lo), 2.0) != 0  # lo is an odd multiple of the step
            up = (dlo > dhi) | (tie & tie_up)
        r = np.where(exact, lo, np.where(up, hi, lo))
    big = a >= ovf
    r = np.where(big, ovf if mode != "toward_zero" else float(f.max_value), r)
    value_to_code = np.zeros(len(grid), np.int64)
    for k, v in enumerate(_grid(f)[1:-1], start=1):
        value_to_code[k] = f.code_of[v]
    pos = np.searchsorted(grid, r)
    code = value_to_code[np.clip(pos, 0, len(grid) - 1)] | np.where(neg, 0x80, 0)
    zero = r == 0
    zneg = f.zero_codes[-1] if f.has_negative_zero else f.zero_codes[0]
    code = np.where(zero, np.where(neg, zneg, f.zero_codes[0]), code)
    ov_codes = (np.full(a.shape, f.max_code) | np.where(neg, 0x80, 0)) if saturate else \
        np.where(neg, (f.inf_codes or f.nan_encode)[1], (f.inf_codes or f.nan_encode)[0])
    code = np.where((r == ovf) | np.isinf(a), ov_codes, code)
    code = np.where(np.isnan(x64), np.where(neg, f.nan_encode[1], f.nan_encode[0]), code)
    return code.astype(np.uint8).reshape(arr.shape)


def _random_bits_np(seed: int, idx: np.ndarray) -> np.ndarray:
    """Vectorized :func:`random_bits` for an array of uint64 indices."""
    def mix(z):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    with np.errstate(over="ignore"):
        key = np.uint64(_mix64((int(seed) + _GOLDEN) & MASK64))
        return mix(key + (idx + np.uint64(1)) * np.uint64(_GOLDEN)) >> np.uint64(32)
