"""Numba kernels of the emulated scaled GEMM. Internal: the public API is :mod:`fp8lab.gemm`.

Both kernels compute ``C[m, n]`` for ``C = A @ B.T`` with A (M, K) and B given as (N, K) codes, K
cut into segments ``seg[s] .. seg[s+1]`` inside which both operands' scales are constant. The
scale of segment ``s`` for row ``m`` is ``sa[m // bM, ka[s]]``, for column ``n`` it is
``sb[n // bN, kb[s]]``. docs/gemm.md states the arithmetic bit for bit.

The per-work-item bodies are ordinary functions called from the ``prange`` loops, so the
parallel and the serial paths run the same compiled code.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from ._jit import jit

MB = 16     # rows of A per work item of the fp32 kernel
NT = 128   # columns per tile (the accumulators of one work item stay in L1)
NPARTS = 96  # capacity of a float64 expansion (exponents of all terms span < 1100 bits)


@jit(inline="always")
def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@jit(inline="always")
def round_odd(t, err):
    """Round-to-odd (53 bits) of the exact value t + err, where t = RN(t + err)."""
    if err == 0.0 or not math.isfinite(t):
        return t
    m, e = math.frexp(t)
    half = 0.5 * math.ldexp(m, 53)
    if half != math.floor(half):
        return t  # t is odd, and a neighbour of the exact value
    step = math.ldexp(1.0, e - 53)
    toward_zero = (err < 0.0) != (t < 0.0)
    if toward_zero and abs(m) == 0.5:
        step = math.ldexp(1.0, e - 54)  # below a power of two the spacing halves
    return t + step if err > 0.0 else t - step


@jit(inline="always")
def fma32(p, s, c):
    """fl32(p * s + c) rounded once (p, s, c float32 values; p * s is exact in float64)."""
    prod = np.float64(p) * np.float64(s)
    t, err = two_sum(np.float64(c), prod)
    if err == 0.0:
        return np.float32(t)  # the sum is exact in float64: one rounding
    if not math.isfinite(t):
        return np.float32(np.float64(c) + prod)
    return np.float32(round_odd(t, err))


@jit(inline="always")
def round_sig(t, err, p, nearest):
    """The exact value t + err (t = RN53 of it) rounded to p significant bits.

    nearest: round to nearest, ties to even; else toward zero (truncation).
    """
    if t == 0.0 or not math.isfinite(t):
        return t
    m, e = math.frexp(t)
    y = math.ldexp(m, p)  # |y| in [2^(p-1), 2^p)
    if nearest:
        r = np.rint(y)
        d = y - r
        if (d == 0.5 or d == -0.5) and err != 0.0:
            # t is a midpoint but the exact value is not: the error decides
            r = math.floor(y) + 1.0 if err > 0.0 else math.floor(y)
    else:
        r = math.trunc(y)
        if r == y and err != 0.0 and ((err < 0.0) != (t < 0.0)):
            # t on the grid, exact value slightly smaller in magnitude
            if abs(r) == math.ldexp(1.0, p - 1):
                return math.copysign(math.ldexp(math.ldexp(1.0, p) - 1.0, e - p - 1), t)
            r = r - 1.0 if t > 0.0 else r + 1.0
    return math.ldexp(r, e - p)


@jit
def _fp32_block(mb, Av, Bt, M, N, seg, nseg, ka, kb, sa, sb, bM, bN, amb, nearest, out):
    m0 = mb * MB
    m1 = min(M, m0 + MB)
    acc = np.zeros((MB, NT), np.float32)
    accd = np.zeros((MB, NT), np.float64)
    main = np.zeros((MB, NT), np.float32)
    sbj = np.zeros(NT, np.float32)
    for n0 in range(0, N, NT):
        n1 = min(N, n0 + NT)
        nn = n1 - n0
        main[:, :] = 0.0
        for s in range(nseg):
            k0 = seg[s]
            k1 = seg[s + 1]
            if amb < 0:
                acc[:, :] = 0.0
                for k in range(k0, k1):
                    brow = Bt[k, n0:n1]
                    for i in range(m1 - m0):
                        a = Av[m0 + i, k]
                        arow = acc[i]
                        for j in range(nn):  # independent outputs: vectorizes over j
                            arow[j] = arow[j] + a * brow[j]
            else:
                accd[:, :] = 0.0
                for k in range(k0, k1):
                    for i in range(m1 - m0):
                        a = Av[m0 + i, k]
                        for j in range(nn):
                            t, err = two_sum(accd[i, j], np.float64(a * Bt[k, n0 + j]))
                            accd[i, j] = round_sig(t, err, amb + 1, nearest)
                for i in range(m1 - m0):
                    for j in range(nn):
                        acc[i, j] = np.float32(accd[i, j])
            for j in range(nn):
                sbj[j] = sb[(n0 + j) // bN, kb[s]]
            for i in range(m1 - m0):
                sai = np.float64(sa[(m0 + i) // bM, ka[s]])
                arow = acc[i]
                mrow = main[i]
                for j in range(nn):
                    sc = np.float32(sai * np.float64(sbj[j]))
                    mrow[j] = fma32(arow[j], sc, mrow[j])
        for i in range(m1 - m0):
            for j in range(nn):
                out[m0 + i, n0 + j] = main[i, j]


@jit(parallel=True)
def gemm_fp32(Av, Bt, M, N, seg, nseg, ka, kb, sa, sb, bM, bN, amb, nearest, out):
    """The "fp32" model; Av (M, K) and Bt (K, N): decoded values (float32, unscaled)."""
    for mb in prange((M + MB - 1) // MB):
        _fp32_block(mb, Av, Bt, M, N, seg, nseg, ka, kb, sa, sb, bM, bN, amb, nearest, out)


@jit(inline="always")
def grow(parts, n, x):
    """Add x to the non-overlapping expansion parts[:n] (exactly); returns the new length."""
    i = 0
    for j in range(n):
        y = parts[j]
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo != 0.0:
            parts[i] = lo
            i += 1
        x = hi
    if x != 0.0 or i == 0:
        parts[i] = x
        i += 1
    return i


@jit(inline="always")
def round_expansion(parts, n, odd):
    """The exact sum of parts[:n] rounded to float64: to odd (odd=True) or to nearest-even."""
    if n == 0:
        return 0.0
    j = n - 1
    hi = parts[j]
    lo = 0.0
    while j > 0:
        j -= 1
        x = hi
        y = parts[j]
        hi = x + y
        yr = hi - x
        lo = y - yr
        if lo != 0.0:
            break
    if lo == 0.0:
        return hi
    if odd:
        return round_odd(hi, lo)
    # nearest-even: as Python's math.fsum, a half-way lo is settled by the next part's sign
    if j > 0 and ((lo < 0.0 and parts[j - 1] < 0.0) or (lo > 0.0 and parts[j - 1] > 0.0)):
        y = lo * 2.0
        x = hi + y
        yr = x - hi
        if y == yr:
            hi = x
    return hi


@jit(inline="always")
def _add_scaled(parts, n, v, shi, slo, shift):
    """parts += v * (shi + slo) * 2^shift exactly, for an int64 v (pieces of 21 bits)."""
    p0 = v & 0x1FFFFF
    v1 = v >> 21
    p1 = v1 & 0x1FFFFF
    p2 = v1 >> 21
    for t in range(3):
        piece = p0 if t == 0 else (p1 if t == 1 else p2)
        if piece != 0:
            n = grow(parts, n, math.ldexp(np.float64(piece) * shi, shift + 21 * t))
            if slo != 0.0:
                n = grow(parts, n, math.ldexp(np.float64(piece) * slo, shift + 21 * t))
    return n


@jit
def _exact_row(m, Ac, Bc, N, seg, nseg, ka, kb, sa, sb, bM, bN, TA, TB, TAh, TAl, TBh, TBl, split,
               h, lsb, odd, out, parts):
    for n in range(N):
        npart = 0
        for s in range(nseg):
            a0 = np.int64(0)
            a1 = np.int64(0)
            a2 = np.int64(0)
            if split:
                for k in range(seg[s], seg[s + 1]):
                    ca = Ac[m, k]
                    cb = Bc[n, k]
                    ah = TAh[ca]
                    al = TAl[ca]
                    bh = TBh[cb]
                    bl = TBl[cb]
                    a2 += ah * bh
                    a1 += ah * bl + al * bh
                    a0 += al * bl
            else:
                for k in range(seg[s], seg[s + 1]):
                    a0 += TA[Ac[m, k]] * TB[Bc[n, k]]
            if a0 == 0 and a1 == 0 and a2 == 0:
                continue
            sp = np.float64(sa[m // bM, ka[s]]) * np.float64(sb[n // bN, kb[s]])  # exact
            mm, e = math.frexp(sp)
            shi = math.ldexp(math.trunc(math.ldexp(mm, 24)), e - 24)
            slo = sp - shi
            if a0 != 0:
                npart = _add_scaled(parts, npart, a0, shi, slo, lsb)
            if a1 != 0:
                npart = _add_scaled(parts, npart, a1, shi, slo, lsb + h)
            if a2 != 0:
                npart = _add_scaled(parts, npart, a2, shi, slo, lsb + 2 * h)
        out[m, n] = round_expansion(parts, npart, odd)


@jit(parallel=True)
def gemm_exact(Ac, Bc, M, N, seg, nseg, ka, kb, sa, sb, bM, bN, TA, TB, TAh, TAl, TBh, TBl, split,
               h, lsb, odd, out):
    """The "exact" model: codes as integers (value = int * 2^lsb_fmt), sums in int64 per
    segment, segments combined in a float64 expansion, rounded once (to odd, or to nearest)."""
    for m in prange(M):
        parts = np.empty(NPARTS, np.float64)
        _exact_row(m, Ac, Bc, N, seg, nseg, ka, kb, sa, sb, bM, bN, TA, TB, TAh, TAl, TBh, TBl,
                   split, h, lsb, odd, out, parts)
