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
from llvmlite import ir as llvm_ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._jit import jit
from ._kernels import fma32

MB = 16     # rows of A per work item of the reduced-accumulator fp32 kernel
NT = 128   # columns per tile (the accumulators of one work item stay in L1)
MR = 6      # register tile of the float32-accumulator kernel: MR rows x NR columns,
NR = 16     # 12 vectors of 8 float32 (AVX2's 16 registers hold them, B's two vectors and a)
MBF = 48    # rows of A per work item of the float32-accumulator kernel (a multiple of MR)
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


def _make_microkernel(mr, nr, width=8):
    """``tile(ap, aoff, bp, boff, nk, cbuf)``: the float32 partial sums of an mr x nr tile.

    ``ap[aoff + t*mr + r]`` is A[i0 + r, k0 + t] and ``bp[boff + t*nr + c]`` is B[j0 + c, k0 + t]
    (operands packed by :func:`fp8lab.gemm`); for every t in increasing order each accumulator
    does ``acc = fl32(acc + fl32(a * b))`` (IEEE float32 multiply and add, no contraction), then
    the tile is stored to ``cbuf`` (row-major). Written as LLVM IR so the mr * nr / width vector
    accumulators stay in registers for the whole K-run: the order of operations per output is
    exactly the scalar loop's, only several outputs advance at once.
    """
    nv = nr // width

    @intrinsic
    def tile(typingctx, ap, aoff, bp, boff, nk, cbuf):
        f32 = types.Array(types.float32, 1, "C")
        if not (ap == f32 and bp == f32 and cbuf == f32):
            return None
        sig = types.void(ap, types.intp, bp, types.intp, types.intp, cbuf)

        def codegen(context, builder, signature, args):
            apv, aoffv, bpv, boffv, nkv, cbv = args
            a_arr = context.make_array(signature.args[0])(context, builder, apv)
            b_arr = context.make_array(signature.args[2])(context, builder, bpv)
            c_arr = context.make_array(signature.args[5])(context, builder, cbv)
            vt = llvm_ir.VectorType(llvm_ir.FloatType(), width)
            i32 = llvm_ir.IntType(32)
            intp = context.get_value_type(types.intp)

            def const(v):
                return llvm_ir.Constant(intp, v)

            def vec_ptr(base, offset):
                return builder.bitcast(builder.gep(base, [const(offset)]), vt.as_pointer())

            accs = [cgutils.alloca_once_value(builder, llvm_ir.Constant(vt, [0.0] * width))
                    for _ in range(mr * nv)]  # promoted to registers by LLVM
            a0 = builder.gep(a_arr.data, [aoffv])
            b0 = builder.gep(b_arr.data, [boffv])
            undef = llvm_ir.Constant(vt, llvm_ir.Undefined)
            splat = llvm_ir.Constant(llvm_ir.VectorType(i32, width), [0] * width)
            with cgutils.for_range(builder, nkv) as loop:
                brow = builder.gep(b0, [builder.mul(loop.index, const(nr))])
                bvec = [builder.load(vec_ptr(brow, v * width), align=4) for v in range(nv)]
                arow = builder.gep(a0, [builder.mul(loop.index, const(mr))])
                for r in range(mr):
                    a = builder.load(builder.gep(arow, [const(r)]), align=4)
                    av = builder.shuffle_vector(
                        builder.insert_element(undef, a, llvm_ir.Constant(i32, 0)), undef, splat)
                    for v in range(nv):
                        acc = accs[r * nv + v]
                        builder.store(builder.fadd(builder.load(acc), builder.fmul(av, bvec[v])),
                                      acc)
            for r in range(mr):
                for v in range(nv):
                    builder.store(builder.load(accs[r * nv + v]),
                                  vec_ptr(c_arr.data, r * nr + v * width), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile_fp32 = _make_microkernel(MR, NR)


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
def _fp32_rows(ib, Ap, Bp, M, N, K, seg, nseg, ka, kb, sa, sb, bM, bN, out):
    """Rows ib*MBF .. of the "fp32" model with a float32 inner accumulator (packed operands)."""
    i_lo = ib * MBF
    rows = min(M, i_lo + MBF) - i_lo
    ntiles = (rows + MR - 1) // MR
    cbuf = np.empty(MR * NR, np.float32)
    main = np.empty((ntiles * MR, NR), np.float32)
    sbj = np.empty(NR, np.float32)
    for jp in range((N + NR - 1) // NR):
        j0 = jp * NR
        main[:, :] = 0.0
        for s in range(nseg):
            k0 = seg[s]
            for c in range(NR):
                sbj[c] = sb[min(j0 + c, N - 1) // bN, kb[s]]
            for t in range(ntiles):
                i0 = i_lo + t * MR
                _tile_fp32(Ap, (i0 // MR) * K * MR + k0 * MR, Bp, jp * K * NR + k0 * NR,
                           seg[s + 1] - k0, cbuf)
                for r in range(MR):
                    sar = sa[min(i0 + r, M - 1) // bM, ka[s]]
                    mrow = main[t * MR + r]
                    for c in range(NR):  # fl32(sa * sb): float32 multiplication rounds once
                        mrow[c] = fma32(cbuf[r * NR + c], sar * sbj[c], mrow[c])
        for i in range(rows):
            for c in range(min(NR, N - j0)):
                out[i_lo + i, j0 + c] = main[i, c]


@jit(parallel=True)
def gemm_fp32(Ap, Bp, M, N, K, seg, nseg, ka, kb, sa, sb, bM, bN, out):
    """The "fp32" model with a float32 inner accumulator.

    Ap, Bp: decoded (unscaled) float32 operands packed by :func:`pack`: A in MR-row panels,
    B (N, K) in NR-row panels, so one tile's K-run of either operand is contiguous.
    """
    for ib in prange((M + MBF - 1) // MBF):
        _fp32_rows(ib, Ap, Bp, M, N, K, seg, nseg, ka, kb, sa, sb, bM, bN, out)


def pack(x, rows_per_panel):
    """(R, K) float32 -> flat panels: element [p, k, r] is x[p * rows_per_panel + r, k] (zero pad)."""
    R, K = x.shape
    Rp = -(-R // rows_per_panel) * rows_per_panel
    padded = np.zeros((Rp, K), np.float32)
    padded[:R] = x
    return np.ascontiguousarray(
        padded.reshape(Rp // rows_per_panel, rows_per_panel, K).transpose(0, 2, 1)).reshape(-1)


@jit
def _reduced_block(mb, Av, Bt, M, N, seg, nseg, ka, kb, sa, sb, bM, bN, amb, nearest, out):
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
                sai = sa[(m0 + i) // bM, ka[s]]
                arow = acc[i]
                mrow = main[i]
                for j in range(nn):
                    mrow[j] = fma32(arow[j], sai * sbj[j], mrow[j])
        for i in range(m1 - m0):
            for j in range(nn):
                out[m0 + i, n0 + j] = main[i, j]


@jit(parallel=True)
def gemm_fp32_reduced(Av, Bt, M, N, seg, nseg, ka, kb, sa, sb, bM, bN, amb, nearest, out):
    """The "fp32" model with a reduced-precision inner accumulator of amb mantissa bits.

    Av (M, K) and Bt (K, N): decoded values (float32, unscaled).
    """
    for mb in prange((M + MB - 1) // MB):
        _reduced_block(mb, Av, Bt, M, N, seg, nseg, ka, kb, sa, sb, bM, bN, amb, nearest, out)


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
