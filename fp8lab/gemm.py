"""Emulated scaled GEMM on the CPU: ``C = (A_q * s_a) @ (B_q * s_b).T``, bit-defined.

Two accumulation models (docs/gemm.md states them bit for bit):

* ``"exact"``: every product exact, the whole sum exact, one rounding into ``out_dtype``.
* ``"fp32"``: per K-segment (a run of K inside which both operands' scales are constant, cut
  further by ``promote_interval``) an inner accumulator adds the exact products in increasing k,
  rounding after every add: to float32 (nearest-even) by default, or to
  ``accumulator_mantissa_bits`` (Hopper's fast accumulation keeps about 14); each segment is then
  promoted into a float32 main accumulator as DeepGEMM does: ``main = fma(partial, fl32(sa*sb),
  main)``, one rounding.

>>> import numpy as np, fp8lab
>>> from fp8lab.gemm import gemm, reference_gemm
>>> a = fp8lab.quantize(np.array([[1.0, 2.0], [3.0, 4.0]]), "e4m3", scaling="tensor,pow2")
>>> b = fp8lab.quantize(np.array([[1.0, 1.0], [0.5, -1.0]]), "e4m3", scaling="tensor,pow2")
>>> gemm(a, b).tolist(), gemm(a, b, accumulate="fp32").tolist()
([[3.0, -1.5], [7.0, -2.5]], [[3.0, -1.5], [7.0, -2.5]])
>>> reference_gemm(a, b).tolist()
[[3.0, -1.5], [7.0, -2.5]]
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from .formats import Format, _float_dtype, get_format
from .qtensor import QTensor, round_from_float64

__all__ = ["gemm", "reference_gemm", "error_bound", "GemmErrorBound", "ACCUMULATE", "LAYOUTS",
           "ACCUMULATOR_ROUNDING"]

ACCUMULATE = ("exact", "fp32")
LAYOUTS = ("NT", "NN")
ACCUMULATOR_ROUNDING = ("toward_zero", "nearest_even")
_SEG_MAX = 1 << 22  # longest exact-mode run summed in int64 (2^40 * 2^22 < 2^63)
_U32 = 2.0 ** -24


class _LazyKernels:
    def __getattr__(self, name):
        from . import _gemm_kernels
        return getattr(_gemm_kernels, name)


GK = _LazyKernels()


def _operands(a_q, b_q, layout):
    for name, q in (("a_q", a_q), ("b_q", b_q)):
        if not isinstance(q, QTensor):
            raise ValueError(f"{name} must be a QTensor (from fp8lab.quantize), got {type(q).__name__}")
        if q.ndim != 2:
            raise ValueError(f"{name} must be 2-d, got shape {q.shape}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)} "
                         "(NT: B is (N, K), C = A @ B.T; NN: B is (K, N), C = A @ B)")
    M, K = a_q.shape
    if layout == "NT":
        N, Kb = b_q.shape
        want = f"(N, {K})"
    else:
        Kb, N = b_q.shape
        want = f"({K}, N)"
    if Kb != K:
        raise ValueError(f"A has shape {a_q.shape} (M, K) so B must have shape {want} for layout "
                         f"{layout}; got {b_q.shape}")
    return M, N, K


def _scale_grid(q: QTensor, transpose: bool):
    """(scales as (rows, K) grid, block rows, block K) of an operand; B in NN is transposed."""
    bs = q.scaling.block_shape(q.shape)
    s = q.scales
    if transpose:
        return np.ascontiguousarray(s.T), bs[1], bs[0]
    return np.ascontiguousarray(s), bs[0], bs[1]


def _segments(K, bka, bkb, extra=None):
    cuts = {0, K}
    for step in (bka, bkb, extra):
        if step:
            cuts.update(range(0, K, step))
    seg = np.array(sorted(cuts), np.int64)
    return seg, seg[:-1] // bka, seg[:-1] // bkb


def reference_gemm(a_q: QTensor, b_q: QTensor, *, layout: str = "NT") -> np.ndarray:
    """float64 ``A @ B.T`` (or ``A @ B`` for NN) of the dequantized operands (numpy matmul)."""
    _operands(a_q, b_q, layout)
    a = a_q.dequantize(np.float64)
    b = b_q.dequantize(np.float64)
    return a @ (b.T if layout == "NT" else b)


@functools.lru_cache(maxsize=None)
def _int_table(fmt: Format):
    """(values as int64 multiples of 2^lsb (non-finite codes: 0), lsb, max |int|)."""
    vals = fmt.decode_table("float64")
    lsb = int(math.log2(fmt.finfo.smallest_subnormal))
    t = np.where(np.isfinite(vals), vals, 0.0)
    ints = np.ldexp(t, -lsb)
    if not np.array_equal(ints, np.round(ints)):
        raise AssertionError(f"{fmt.name}: values are not multiples of the smallest subnormal")
    ints = ints.astype(np.int64)
    ints.setflags(write=False)
    return ints, lsb, int(np.abs(ints).max())


def gemm(a_q: QTensor, b_q: QTensor, *, accumulate: str = "exact", out_dtype=np.float32,
         promote_interval: int | None = None, accumulator_mantissa_bits: int | None = None,
         accumulator_rounding: str = "toward_zero", layout: str = "NT") -> np.ndarray:
    """Emulated scaled GEMM of two quantized operands.

    Parameters
    ----------
    a_q : QTensor
        A, of shape (M, K).
    b_q : QTensor
        B, of shape (N, K) for ``layout="NT"`` (``C = A @ B.T``) or (K, N) for ``"NN"``.
    accumulate : {"exact", "fp32"}
        The accumulation model (see the module doc and docs/gemm.md).
    out_dtype : float32 (default), float16, bfloat16 or float64
        ``exact``: the exact sum rounded once into it. ``fp32``: the float32 main accumulator
        rounded (nearest-even) into it.
    promote_interval : int, optional
        ``fp32`` only: also start a new inner accumulator every ``promote_interval`` elements of
        K (at multiples of it), as DeepGEMM does every 128.
    accumulator_mantissa_bits : int, optional
        ``fp32`` only: the inner accumulator keeps this many mantissa bits (1..23) instead of
        float32's 23, rounding every add by ``accumulator_rounding``.
    accumulator_rounding : {"toward_zero", "nearest_even"}
        Rounding of the reduced-precision accumulator (default: truncation, as measured on NVIDIA
        tensor cores).
    layout : {"NT", "NN"}

    Returns
    -------
    ndarray of ``out_dtype``, shape (M, N).

    Scales: the scale of A's element (m, k) times that of B's element (n, k) is constant on each
    K-segment; segment boundaries are the multiples of both operands' K-block sizes (and of
    ``promote_interval``). Any pair of recipes works: per-tensor and per-row scales are constant
    along K, 1xB blocks and BxB tiles cut K every B.
    """
    M, N, K = _operands(a_q, b_q, layout)
    if accumulate not in ACCUMULATE:
        raise ValueError(f"unknown accumulate {accumulate!r}; known: {', '.join(ACCUMULATE)}")
    dt = _float_dtype(out_dtype)
    if accumulator_rounding not in ACCUMULATOR_ROUNDING:
        raise ValueError(f"unknown accumulator_rounding {accumulator_rounding!r}; known: "
                         f"{', '.join(ACCUMULATOR_ROUNDING)}")
    if accumulate == "exact" and (promote_interval is not None or accumulator_mantissa_bits is not None):
        raise ValueError("promote_interval and accumulator_mantissa_bits apply to "
                         "accumulate='fp32' only; 'exact' has no intermediate rounding")
    if promote_interval is not None:
        if isinstance(promote_interval, bool) or not isinstance(promote_interval, (int, np.integer)) \
                or promote_interval < 1:
            raise ValueError(f"promote_interval must be an int >= 1 or None, got {promote_interval!r}")
    amb = accumulator_mantissa_bits
    if amb is not None:
        if isinstance(amb, bool) or not isinstance(amb, (int, np.integer)) or not 1 <= amb <= 23:
            raise ValueError(f"accumulator_mantissa_bits must be an int in 1..23 or None, got {amb!r}")
    sa, bM, bKa = _scale_grid(a_q, False)
    sb, bN, bKb = _scale_grid(b_q, layout == "NN")
    out = np.zeros((M, N), np.float32 if accumulate == "fp32" else np.float64)
    if M == 0 or N == 0:
        return out.astype(dt)
    if accumulate == "fp32":
        seg, ka, kb = _segments(K, bKa, bKb, promote_interval)
        av = a_q.format.decode_table("float32")[a_q.codes]
        bv = b_q.format.decode_table("float32")[b_q.codes]
        if amb is None:
            GK.gemm_fp32(GK.pack(av, GK.MR), GK.pack(bv if layout == "NT" else bv.T, GK.NR),
                         M, N, K, seg, len(seg) - 1, ka, kb, sa, sb, bM, bN, out)
        else:
            bt = np.ascontiguousarray(bv.T if layout == "NT" else bv)
            GK.gemm_fp32_reduced(av, bt, M, N, seg, len(seg) - 1, ka, kb, sa, sb, bM, bN,
                                 int(amb), accumulator_rounding == "nearest_even", out)
        return out if dt == np.float32 else round_from_float64(out.astype(np.float64), dt)
    seg, ka, kb = _segments(K, bKa, bKb, _SEG_MAX)
    TA, lsb_a, max_a = _int_table(a_q.format)
    TB, lsb_b, max_b = _int_table(b_q.format)
    h = 20
    if max(max_a, max_b) >= 1 << 40:
        raise ValueError("format values span more than 40 bits; the exact kernel cannot hold them")
    split = max_a * max_b >= 1 << 40
    ac = a_q.codes
    bc = np.ascontiguousarray(b_q.codes if layout == "NT" else b_q.codes.T)
    GK.gemm_exact(ac, bc, M, N, seg, len(seg) - 1, ka, kb, sa, sb, bM, bN, TA, TB,
                  TA >> h, TA & ((1 << h) - 1), TB >> h, TB & ((1 << h) - 1), split, h,
                  lsb_a + lsb_b, dt != np.float64, out)
    _fix_specials(a_q, b_q, layout, out)
    return round_from_float64(out, dt)


def _fix_specials(a_q, b_q, layout, out):
    """Outputs touching a NaN/Inf code: IEEE's result of the exact sum (NaN, or +-Inf)."""
    bad_a = (~np.isfinite(a_q.format.decode_table("float64"))[a_q.codes]).any(axis=1)
    bad_b = (~np.isfinite(b_q.format.decode_table("float64"))[b_q.codes]).any(
        axis=1 if layout == "NT" else 0)
    if not (bad_a.any() or bad_b.any()):
        return
    a = a_q.dequantize(np.float64)
    b = b_q.dequantize(np.float64)
    bt = b if layout == "NT" else b.T
    rows = np.flatnonzero(bad_a)
    cols = np.flatnonzero(bad_b)
    with np.errstate(invalid="ignore", over="ignore"):
        if rows.size:
            out[rows, :] = _ieee_dot(a[rows], bt)
        if cols.size:
            out[:, cols] = _ieee_dot(a, bt[cols])


def _ieee_dot(a, bt):
    """Sum of products with IEEE special-value rules (finite parts do not matter: non-finite)."""
    prod = a[:, None, :] * bt[None, :, :]
    return prod.sum(axis=2)


# ---------------------------------------------------------------------------- error bounds
def _gamma(n: int, u: float) -> float:
    if n * u >= 1:
        return math.inf
    return n * u / (1 - n * u)


def _format_error(fmt: Format, rounding: str) -> tuple[float, float]:
    """(u, eta): |q(v) - v| <= u |v| + eta for v within range (nearest; doubled otherwise)."""
    b = fmt.binades
    sn = fmt.finfo.smallest_normal
    e_sn = math.floor(math.log2(sn))
    m_min = int(min(b.mbits[e - b.e_low] for e in range(e_sn, b.e_max + 1)))
    u = 2.0 ** -(m_min + 1)
    vals = [0.0] + [float(v) for v in fmt.positive_values if v <= sn]
    eta = max(hi - lo for lo, hi in zip(vals, vals[1:])) / 2
    if rounding != "nearest":
        u, eta = 2 * u, 2 * eta
    return u, eta


@dataclasses.dataclass(frozen=True)
class GemmErrorBound:
    """Coefficients of the error bound of an emulated GEMM (see :func:`error_bound`).

    Attributes
    ----------
    accumulation : float
        ``|C_model - C_exact| <= accumulation * (|A_q| @ |B_q|.T)`` before the output rounding
        (``A_q``, ``B_q``: the dequantized operands, ``C_exact`` their exact product).
    output, output_abs : float
        Rounding into ``out_dtype``: relative unit roundoff and half its smallest subnormal.
    quantization_a, quantization_b, absolute_a, absolute_b : float
        ``|q(x) - x| <= u * |x| + eta * scale`` for an element in range (per operand format).
    """

    accumulation: float
    output: float
    output_abs: float
    quantization_a: float
    quantization_b: float
    absolute_a: float
    absolute_b: float

    def model_bound(self, a_q: QTensor, b_q: QTensor, *, layout: str = "NT") -> np.ndarray:
        """Elementwise bound of ``|gemm(...) - exact product of the dequantized operands|``."""
        a = np.abs(a_q.dequantize(np.float64))
        b = np.abs(b_q.dequantize(np.float64))
        mag = a @ (b.T if layout == "NT" else b)
        return (self.accumulation + self.output * (1 + self.accumulation)) * mag + self.output_abs

    def total_bound(self, a: np.ndarray, b: np.ndarray, a_q: QTensor, b_q: QTensor, *,
                    layout: str = "NT") -> np.ndarray:
        """Elementwise bound of ``|gemm(quantize(a), quantize(b)) - a @ b.T|`` (no overflow)."""
        a = np.abs(np.asarray(a, np.float64))
        b = np.abs(np.asarray(b, np.float64))
        da = self.quantization_a * a + self.absolute_a * a_q.expanded_scales()
        db = self.quantization_b * b + self.absolute_b * b_q.expanded_scales()
        t = (lambda x: x.T) if layout == "NT" else (lambda x: x)
        quant = da @ t(b) + (a + da) @ t(db)
        mag = (a + da) @ t(b + db)
        return quant + (self.accumulation + self.output * (1 + self.accumulation)) * mag + self.output_abs


def error_bound(K: int, a_format, b_format, *, accumulate: str = "fp32", block_k: int | None = None,
                promote_interval: int | None = None, accumulator_mantissa_bits: int | None = None,
                accumulator_rounding: str = "toward_zero", out_dtype=np.float32,
                rounding: str = "nearest") -> GemmErrorBound:
    """The error bound of an emulated GEMM of reduction length K (docs/gemm.md derives it).

    ``block_k`` is the smaller K-block size of the two operands' scales (None: constant along K).
    With ``L`` the longest inner run and ``S`` the number of segments, ``u`` = 2^-24 and ``u_acc``
    the accumulator's unit roundoff (2^-24; 2^-(b+1) nearest or 2^-b truncating for b mantissa
    bits), ``gamma(n, u) = n u / (1 - n u)``::

        accumulation = gamma(L-1, u_acc) (1 + u) + u + gamma(S, u) (1 + u) (1 + gamma(L-1, u_acc))

    and 0 for ``"exact"``. ``rounding`` of the quantization: "nearest" or anything else (toward
    zero, stochastic: twice the nearest bound).

    >>> b = error_bound(1024, "e4m3", "e4m3", block_k=128)
    >>> round(b.accumulation / 2.0**-24, 2), b.quantization_a
    (136.0, 0.0625)
    """
    K = int(K)
    if K < 0:
        raise ValueError(f"K must be >= 0, got {K}")
    fa, fb = get_format(a_format), get_format(b_format)
    if accumulate not in ACCUMULATE:
        raise ValueError(f"unknown accumulate {accumulate!r}; known: {', '.join(ACCUMULATE)}")
    dt = _float_dtype(out_dtype)
    out_u = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11,
             "bfloat16": 2.0 ** -8}[dt.name]
    out_abs = {"float64": 2.0 ** -1075, "float32": 2.0 ** -150, "float16": 2.0 ** -25,
               "bfloat16": 2.0 ** -134}[dt.name]
    if accumulate == "exact":
        acc = 0.0
    else:
        runs = [r for r in (block_k, promote_interval) if r]
        L = min([K, *runs]) if K else 0
        S = sum(-(-K // r) for r in runs) if runs else (1 if K else 0)
        S = min(S, K) if K else 0
        if accumulator_mantissa_bits is None:
            ua = _U32
        elif accumulator_rounding == "nearest_even":
            ua = 2.0 ** -(accumulator_mantissa_bits + 1)
        else:
            ua = 2.0 ** -accumulator_mantissa_bits
        ga = _gamma(max(L - 1, 0), ua)
        acc = ga * (1 + _U32) + _U32 + _gamma(S, _U32) * (1 + _U32) * (1 + ga)
        if dt == np.float32:
            out_u, out_abs = 0.0, 0.0  # the main accumulator is already float32
    ua_q, ea_q = _format_error(fa, rounding)
    ub_q, eb_q = _format_error(fb, rounding)
    return GemmErrorBound(acc, out_u, out_abs, ua_q, ub_q, ea_q, eb_q)
