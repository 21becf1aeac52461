"""Numba kernels of the CPU codecs. Internal: the public API is :mod:`fp8lab.codecs`.

Two encoders, both driven only by a format's :class:`~fp8lab.formats.BinadeTable`:

* ``encode_bits_*``: the generic encoder, integer arithmetic on the input's IEEE bits (float32 or
  float64), every rounding mode including stochastic. For a positive input ``a`` in binade ``e``
  with ``P``-bit significand ``sig``::

        a = sig * 2^(e - P + 1)              sig in [2^(P-1), 2^P)
        step(e) = 2^(e - m(e))               m(e): the format's mantissa bits in binade e
        s = P - 1 - m(e)                     bits of sig below the step
        q = sig >> s  (+1 if rounded up)     value = q * step(e)

  Below the smallest value's binade, m(e) = e - e_low < 0, so the step is the smallest value and
  ``q`` is 0 or 1. ``q == 2^(m+1)`` is a carry into binade e+1; code = base[e] + q - 2^m.

* ``lut_*``: table lookup for float32/float16/bfloat16 in deterministic modes. For a float32 with
  bits ``hi16:lo16``, the rounding point of every fp8 format (m <= 6) lies at bit 16 or above, so
  the code depends only on ``hi16`` and on whether ``lo16 != 0`` (which breaks an exact tie).
  The 2^17-entry table is built by the generic encoder and proven equal to it on all 2^32 inputs
  by ``python -m fp8lab.conformance``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as llvm_ir
from numba import prange, types
from numba.extending import intrinsic

from ._jit import jit

# layout of the ``codes`` array passed to the encoders
C_MAX, C_ZERO_POS, C_ZERO_NEG, C_NAN_POS, C_NAN_NEG, C_OVF_POS, C_OVF_NEG = range(7)
MODE_CODES = {"nearest_even": 0, "nearest_away": 1, "toward_zero": 2, "stochastic": 3}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@intrinsic
def fma32(typingctx, p, s, c):
    """fl32(p * s + c) rounded once: LLVM's ``llvm.fma.f32`` (the FMA instruction where the CPU
    has one, else the C library's correctly rounded ``fmaf``). Vectorizes."""
    if not all(t == types.float32 for t in (p, s, c)):
        return None

    def codegen(context, builder, signature, args):
        f = llvm_ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], llvm_ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@jit(inline="always")
def mix64(z):
    """SplitMix64 finalizer on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit(inline="always")
def random_bits(key, i):
    """32 random bits for element ``i`` under ``key = mix64(seed + golden)`` (as int64)."""
    z = key + np.uint64(i + 1) * np.uint64(0x9E3779B97F4A7C15)
    return np.int64(mix64(z) >> np.uint64(32))


@jit(inline="always")
def encode_one(neg, a, P, in_bias, inf_bits, mode, sat, e_low, e_max, top_count, mbits, base,
               codes, key, idx):
    """Encode one magnitude ``a`` (IEEE bits without sign, int64) of a P-bit-significand float."""
    if a >= inf_bits:
        if a > inf_bits:
            return codes[C_NAN_NEG] if neg else codes[C_NAN_POS]
        if sat:
            return codes[C_MAX] | (0x80 if neg else 0)
        return codes[C_OVF_NEG] if neg else codes[C_OVF_POS]
    if a == 0:
        return codes[C_ZERO_NEG] if neg else codes[C_ZERO_POS]
    m = 0
    mant = 0
    ebits = a >> (P - 1)
    if ebits == 0:
        # input subnormal: far below every format's smallest value (2^-126 vs >= 2^-23), so
        # the step is the smallest value and the fraction (a / step) * 2^32 is in (0, 1)
        e = e_low - 4096
        sig = a
    else:
        e = ebits - in_bias
        sig = (a & ((np.int64(1) << (P - 1)) - 1)) | (np.int64(1) << (P - 1))
    if e > e_max:
        q = -1  # beyond the top binade: overflow
    else:
        m = mbits[e - e_low] if e >= e_low else e - e_low
        s = P - 1 - m  # >= P - 1 - 6 > 0
        if mode == 3:
            r = random_bits(key, idx)
            if s >= P:
                q, rem = 0, sig
            else:
                q, rem = sig >> s, sig & ((np.int64(1) << s) - 1)
            if s <= 32:
                thr = rem << (32 - s)
            elif s - 32 < 63:
                d = s - 32
                thr = (rem >> d) + (1 if (rem & ((np.int64(1) << d) - 1)) != 0 else 0)
            else:
                thr = 1 if rem != 0 else 0
            if r < thr:
                q += 1
        elif s > P:
            q = 0  # below half the smallest value: 0 in every deterministic mode
        else:
            q = sig >> s
            rem = sig & ((np.int64(1) << s) - 1)
            half = np.int64(1) << (s - 1)
            if mode == 0:
                if rem > half or (rem == half and (q & 1) == 1):
                    q += 1
            elif mode == 1:
                if rem >= half:
                    q += 1
        if q == 0:
            return codes[C_ZERO_NEG] if neg else codes[C_ZERO_POS]
        if m < 0:
            e, mant = e_low, 0
        elif q == (np.int64(1) << (m + 1)):
            e, mant = e + 1, 0
        else:
            mant = q - (np.int64(1) << m)
        if e > e_max or (e == e_max and mant >= top_count):
            q = -1
    if q == -1:
        if sat or mode == 2:
            return codes[C_MAX] | (0x80 if neg else 0)
        return codes[C_OVF_NEG] if neg else codes[C_OVF_POS]
    return base[e - e_low] + mant + (0x80 if neg else 0)


@jit(inline="always")
def _split(u, W):
    neg = ((u >> (W - 1)) & 1) == 1
    a = u & ((np.int64(1) << (W - 1)) - 1)
    return neg, a


@jit
def encode_bits_serial(bits, out, W, P, in_bias, mode, sat, e_low, e_max, top_count, mbits,
                       base, codes, key, offset):
    """out[i] = code of the float whose IEEE bits (width W, significand P) are bits[i]."""
    inf_bits = ((np.int64(1) << (W - P)) - 1) << (P - 1)
    for i in range(bits.size):
        neg, a = _split(np.int64(bits[i]), W)
        out[i] = encode_one(neg, a, P, in_bias, inf_bits, mode, sat, e_low, e_max, top_count,
                            mbits, base, codes, key, offset + i)


@jit(parallel=True)
def encode_bits_parallel(bits, out, W, P, in_bias, mode, sat, e_low, e_max, top_count, mbits,
                         base, codes, key, offset):
    """Parallel twin of :func:`encode_bits_serial` (same results: element i uses index i)."""
    inf_bits = ((np.int64(1) << (W - P)) - 1) << (P - 1)
    for i in prange(bits.size):
        neg, a = _split(np.int64(bits[i]), W)
        out[i] = encode_one(neg, a, P, in_bias, inf_bits, mode, sat, e_low, e_max, top_count,
                            mbits, base, codes, key, offset + i)


@jit
def lut32_serial(bits, table, out):
    """out[i] = table[2 * (bits[i] >> 16) + (low 16 bits != 0)] for uint32 bits."""
    for i in range(bits.size):
        u = bits[i]
        out[i] = table[((u >> 15) & 0x1FFFE) | (1 if (u & 0xFFFF) != 0 else 0)]


@jit(parallel=True)
def lut32_parallel(bits, table, out):
    for i in prange(bits.size):
        u = bits[i]
        out[i] = table[((u >> 15) & 0x1FFFE) | (1 if (u & 0xFFFF) != 0 else 0)]


@jit
def lookup_serial(index, table, out):
    """out[i] = table[index[i]] (decode, and float16/bfloat16 encode)."""
    for i in range(index.size):
        out[i] = table[index[i]]


@jit(parallel=True)
def lookup_parallel(index, table, out):
    for i in prange(index.size):
        out[i] = table[index[i]]
