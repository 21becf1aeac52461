"""Numba kernels of scaled quantization. Internal: the public API is :func:`fp8lab.quantize`.

Every tensor is seen as a C-contiguous 3-d array ``(P, R, C)`` cut into blocks of ``BR x BC``
(rows x columns) in each of its ``P`` slabs; block ``(p, i, j)`` has scale
``scales[(p * nbR + i) * nbC + j]``. An element is quantized as::

    q = fl64(x / s)                  x and s (float32) taken exactly as float64, one division
    code = encode(q)                 the format's encoder, rounding q once

For float32 (and float16 / bfloat16) input ``fl64(x / s)`` never crosses a rounding boundary of an
8-bit format (see docs/scaling.md), so the code is the correctly rounded ``x / s``.

Deterministic modes encode ``q`` by the float32 lookup table of :mod:`fp8lab.codecs`, whose index
is a float32's top 16 bits and whether its low 16 bits are nonzero (the rounding point of every
8-bit format lies in the top 16 bits). ``q`` is first cut to float32 *toward zero*, keeping a
sticky bit for what was cut::

    f = fl32(q) (nearest), stepped one unit toward zero if |f| > |q|     trunc32(q)
    sticky = (f != q) or (low 16 bits of trunc32(q) != 0)
    index = (top 16 bits of trunc32(q)) * 2 + sticky

``table[index] == encode(q)``: ``q`` and the float32 with those top bits and that sticky bit lie on
the same side of every rounding boundary. Finite ``q >= 2^128`` becomes float32's largest finite
value (a finite overflow, as it is); NaN and Inf pass through.

Float32 input with a block scale >= 2^-60 (deterministic modes) takes a faster route to the same
codes: ``q = fl32(x / s)`` and the exact residual ``fl32(q * s - x)`` (one fma) give the truncated
float32 and its sticky bit without float64 arithmetic (see ``_encode_f32_block``); the tests
compare both routes with ``encode(fl64(x / s))`` on every float32 high half.

Stochastic rounding uses the generic encoder on the float64 bits, with element ``i``'s random bits
keyed by its C-order index, as :func:`fp8lab.encode` does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from ._jit import jit
from ._kernels import encode_one, fma32

_INF = np.inf
_F64_INF_BITS = 0x7FF << 52  # float64 exponent all ones
_F32_PATH_MIN_SCALE = np.float32(2.0 ** -60)  # also in gpu/quantize.cu (fp8_quantize_elem)


@jit(inline="always")
def scale_of(amax, fmax, emax, rule, margin):
    """Scale of one block (float64 holding a float32 value). See fp8lab.scaling.compute_scale.

    Its device twin is ``fp8_scale_of`` in gpu/quantize.cu (same operations): change both."""
    if amax == 0.0:
        return 1.0
    if amax == _INF:
        return 2.0 ** 127
    if rule == 0:
        s = np.float64(np.float32(amax / fmax)) * (2.0 ** margin)
        if s == 0.0:
            s = 2.0 ** -127
    else:
        m1, e1 = math.frexp(amax)
        if rule == 2:  # OCP MX: floor(log2 amax) - emax_elem
            k = e1 - 1 - emax
        else:  # least k with amax <= fmax * 2^k
            m2, e2 = math.frexp(fmax)
            k = e1 - e2 if m1 <= m2 else e1 - e2 + 1
        k += margin
        k = min(max(k, -127), 127)
        s = math.ldexp(1.0, k)
    s = min(max(s, 2.0 ** -127), 2.0 ** 127)
    return np.float64(np.float32(s))


@jit
def scales_from_amax(amax, out, fmax, emax, rule, margin):
    for i in range(amax.size):
        out[i] = scale_of(amax[i], fmax, emax, rule, margin)


@jit(inline="always")
def _encode_buf(buf, f32, u32, n, out, obase, table, mode, sat, e_low, e_max, top_count, mbits, base,
                codes, key, ibase):
    """Encode the float64 values buf[:n] into out[obase:obase+n]; f32 = fl32(buf), u32 its bits."""
    if mode != 3:  # f32[:n] holds fl32(buf[:n]) (written by the caller's division loop)
        for c in range(n):
            q = buf[c]
            back = np.float64(f32[c])
            b = u32[c]
            if abs(back) > abs(q):
                b -= np.uint32(1)
            st = np.uint32(1) if (back != q) or (b & np.uint32(0xFFFF)) != 0 else np.uint32(0)
            out[obase + c] = table[((b >> np.uint32(15)) & np.uint32(0x1FFFE)) | st]
    else:
        bits = buf.view(np.int64)
        inf_bits = np.int64(_F64_INF_BITS)
        for c in range(n):
            u = bits[c]
            out[obase + c] = encode_one(u < 0, u & 0x7FFFFFFFFFFFFFFF, 53, 1023, inf_bits, mode,
                                        sat, e_low, e_max, top_count, mbits, base, codes, key,
                                        ibase + c)


@jit(inline="always")
def _row_amax(xb, base, C, BC, nbC, amax, mask, inf):
    """amax[j] = max(amax[j], bits of max |x| over finite x of block j); xb: the IEEE bits of x.

    Bits of non-negative floats order as the floats do, and integer max vectorizes.
    """
    zero = amax[0] - amax[0]
    for j in range(nbC):
        c0 = j * BC
        c1 = min(C, c0 + BC)
        m = amax[j]
        for c in range(c0, c1):
            b = xb[base + c] & mask
            m = max(m, b if b < inf else zero)
        amax[j] = m


@jit(inline="always")
def _encode_f32_block(x, s, f32, u32, res, idx, out, table):
    """Deterministic modes, float32 x, scale s >= 2^-60: the same codes as the float64 path.

    q = fl32(x / s) and r = fl32(q * s - x) (one fma) give the direction of the rounding: with
    |x| >= 2^-100 the residual is exactly representable, so r is the exact q * s - x, zero iff
    q == x / s, of the sign of q - x / s. Smaller nonzero |x| has |x / s| < 2^-40, below every
    8-bit format's smallest half-step, where only the sign and nonzero-ness of q matter (a
    residual that underflows leaves q itself nonzero, or q == 0 with r == -x != 0). A finite
    x / s >= 2^128 gives q = Inf and r = Inf: stepped toward zero it is float32's largest finite
    value with the sticky bit, as in the float64 path; x = +-Inf gives r = NaN: no step, no
    sticky bit. Three loops over views from index 0 (so that LLVM sees non-negative
    indices): the first two vectorize, the table lookup cannot.
    """
    n = x.size
    for c in range(n):
        xv = np.float32(x[c])  # x is float32 here (float64 arrays compile this path, never run it)
        q = xv / s
        f32[c] = q
        res[c] = fma32(q, s, -xv)
    for c in range(n):
        q = f32[c]
        r = res[c]
        rp = r > 0.0
        rn = r < 0.0  # branch-free: the signs are data, unpredictable
        b = u32[c] - np.uint32((rp & (q > 0.0)) | (rn & (q < 0.0)))  # |q| > |x / s|: truncate
        st = np.uint32(rp | rn) | np.uint32((b & np.uint32(0xFFFF)) != 0)
        idx[c] = ((b >> np.uint32(15)) & np.uint32(0x1FFFE)) | st
    for c in range(n):
        out[c] = table[idx[c]]


@jit(inline="always")
def _encode_row(x, base, C, BC, nbC, scales, sbase, buf, f32, u32, out, table, mode, sat, e_low,
                e_max, top_count, mbits, base_tab, codes, key, offset):
    res = buf.view(np.float32)[:C]
    idx = buf.view(np.uint32)[C:]
    for j in range(nbC):
        c0 = j * BC
        c1 = min(C, c0 + BC)
        if mode != 3 and x.itemsize == 4 and scales[sbase + j] >= _F32_PATH_MIN_SCALE:
            _encode_f32_block(x[base + c0:base + c1], np.float32(scales[sbase + j]), f32, u32, res,
                              idx, out[base + c0:base + c1], table)
            continue
        s = np.float64(scales[sbase + j])
        for c in range(c0, c1):
            q = np.float64(x[base + c]) / s
            buf[c] = q
            f32[c] = np.float32(q)
        _encode_buf(buf[c0:c1], f32[c0:c1], u32[c0:c1], c1 - c0, out, base + c0, table, mode, sat,
                    e_low, e_max, top_count, mbits, base_tab, codes, key, offset + base + c0)


@jit(inline="always")
def _fused_strip(t, x, xb, mask, inf, R, C, BR, BC, nbR, nbC, fmax, emax, rule, margin, scales, out,
                 table, mode, sat, e_low, e_max, top_count, mbits, base_tab, codes, key, offset):
    p = t // nbR
    i = t - p * nbR
    r0 = i * BR
    r1 = min(R, r0 + BR)
    amax = np.zeros(nbC, xb.dtype)
    for r in range(r0, r1):
        _row_amax(xb, (p * R + r) * C, C, BC, nbC, amax, mask, inf)
    amaxf = amax.view(x.dtype)
    sbase = t * nbC
    for j in range(nbC):
        scales[sbase + j] = scale_of(np.float64(amaxf[j]), fmax, emax, rule, margin)
    buf = np.empty(C, np.float64)
    f32 = np.empty(C, np.float32)
    u32 = f32.view(np.uint32)
    for r in range(r0, r1):
        _encode_row(x, (p * R + r) * C, C, BC, nbC, scales, sbase, buf, f32, u32, out, table, mode,
                    sat, e_low, e_max, top_count, mbits, base_tab, codes, key, offset)


@jit(parallel=True)
def quantize_fused(x, xb, mask, inf, P, R, C, BR, BC, fmax, emax, rule, margin, scales, out, table,
                   mode, sat, e_low, e_max, top_count, mbits, base_tab, codes, key, offset):
    """Amax, scale and encode of each strip of BR rows in one pass (strips in parallel)."""
    nbR = (R + BR - 1) // BR
    nbC = (C + BC - 1) // BC
    for t in prange(P * nbR):
        _fused_strip(t, x, xb, mask, inf, R, C, BR, BC, nbR, nbC, fmax, emax, rule, margin, scales,
                     out, table, mode, sat, e_low, e_max, top_count, mbits, base_tab, codes, key,
                     offset)


@jit
def quantize_fused_serial(x, xb, mask, inf, P, R, C, BR, BC, fmax, emax, rule, margin, scales, out,
                          table, mode, sat, e_low, e_max, top_count, mbits, base_tab, codes, key,
                          offset):
    nbR = (R + BR - 1) // BR
    nbC = (C + BC - 1) // BC
    for t in range(P * nbR):
        _fused_strip(t, x, xb, mask, inf, R, C, BR, BC, nbR, nbC, fmax, emax, rule, margin, scales,
                     out, table, mode, sat, e_low, e_max, top_count, mbits, base_tab, codes, key,
                     offset)


@jit(parallel=True)
def row_amax(x, xb, mask, inf, PR, C, BC, partial):
    """partial[row, j] = max |x| over the finite elements of column block j of each row."""
    nbC = (C + BC - 1) // BC
    for row in prange(PR):
        amax = np.zeros(nbC, xb.dtype)
        _row_amax(xb, row * C, C, BC, nbC, amax, mask, inf)
        amaxf = amax.view(x.dtype)
        for j in range(nbC):
            partial[row * nbC + j] = amaxf[j]


@jit(inline="always")
def _encode_given_row(row, x, R, C, BR, BC, nbR, nbC, scales, out, table, mode, sat, e_low, e_max,
                      top_count, mbits, base_tab, codes, key, offset, buf, f32, u32):
    p = row // R
    r = row - p * R
    sbase = (p * nbR + r // BR) * nbC
    _encode_row(x, row * C, C, BC, nbC, scales, sbase, buf, f32, u32, out, table, mode, sat, e_low,
                e_max, top_count, mbits, base_tab, codes, key, offset)


@jit(parallel=True)
def encode_given(x, P, R, C, BR, BC, scales, out, table, mode, sat, e_low, e_max, top_count, mbits,
                 base_tab, codes, key, offset):
    """Encode every row with scales already known (rows in parallel)."""
    nbR = (R + BR - 1) // BR
    nbC = (C + BC - 1) // BC
    for row in prange(P * R):
        buf = np.empty(C, np.float64)
        f32 = np.empty(C, np.float32)
        _encode_given_row(row, x, R, C, BR, BC, nbR, nbC, scales, out, table, mode, sat, e_low,
                          e_max, top_count, mbits, base_tab, codes, key, offset, buf, f32,
                          f32.view(np.uint32))


@jit
def encode_given_serial(x, P, R, C, BR, BC, scales, out, table, mode, sat, e_low, e_max, top_count,
                        mbits, base_tab, codes, key, offset):
    nbR = (R + BR - 1) // BR
    nbC = (C + BC - 1) // BC
    buf = np.empty(C, np.float64)
    f32 = np.empty(C, np.float32)
    u32 = f32.view(np.uint32)
    for row in range(P * R):
        _encode_given_row(row, x, R, C, BR, BC, nbR, nbC, scales, out, table, mode, sat, e_low,
                          e_max, top_count, mbits, base_tab, codes, key, offset, buf, f32, u32)


@jit(inline="always")
def _dequant_row(row, codes, R, C, BR, BC, nbR, nbC, scales, table, out):
    p = row // R
    r = row - p * R
    sbase = (p * nbR + r // BR) * nbC
    base = row * C
    for j in range(nbC):
        c0 = j * BC
        c1 = min(C, c0 + BC)
        s = np.float64(scales[sbase + j])
        for c in range(c0, c1):
            out[base + c] = table[codes[base + c]] * s


@jit(parallel=True)
def dequantize_rows(codes, P, R, C, BR, BC, scales, table, out):
    """out = decode(code) * scale, the product exact in float64, rounded once to out's type."""
    nbR = (R + BR - 1) // BR
    nbC = (C + BC - 1) // BC
    for row in prange(P * R):
        _dequant_row(row, codes, R, C, BR, BC, nbR, nbC, scales, table, out)


@jit
def dequantize_rows_serial(codes, P, R, C, BR, BC, scales, table, out):
    nbR = (R + BR - 1) // BR
    nbC = (C + BC - 1) // BC
    for row in range(P * R):
        _dequant_row(row, codes, R, C, BR, BC, nbR, nbC, scales, table, out)
