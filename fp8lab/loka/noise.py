"""The error predictor: a candidate's error at a site from the statistics, without the GEMM.

Model (each step is a stated approximation):

1. Element noise. An element ``x`` with ``v = |x| / scale`` gets rounding noise of variance
   ``step(v)^2 / 12`` (``step`` = the format's grid spacing at ``v``; nearest rounding, position
   uniform within a step), is flushed (error ``x``) when ``v < smallest_subnormal / 2`` and saturates
   (error ``|x| - max * scale``) when ``v > max``. The relative noise ``rho = E[e^2] / x^2``
   integrated over an operand's ``log2`` histogram (energy-weighted) gives its noise-to-signal ratio.
2. GEMM propagation. With independent zero-mean element noise,
   ``E||dC_i||^2 = sum_k (E da_ik^2 ||B_:k||^2 + a_ik^2 E||dB_:k||^2 + ...)``; assuming each operand's
   relative noise is uniform across ``k`` this is ``(rho_A,i + rho_B + rho_A,i rho_B) w_i`` with
   ``w_i = sum_k a_ik^2 ||B_:k||^2``. ``rho_A,i`` is per row: the pooled row shape shifted by the
   row's own amax against its scale (so a small row under a per-tensor scale is noisier).
3. Accumulation. fp32 summation adds a relative variance ``u^2 K / 6`` (``u = 2^-24``).
4. Reference. Row ``i`` of C has energy ``N m_i^2 + v_i`` (exact mean ``m_i = A_i . mean(B)``,
   diagonal approximation ``v_i`` of the rest).
5. Following op. LayerNorm removes the part of A's noise that multiplies B's column means (a row
   offset: ``rho_A,i v_i`` replaces ``rho_A,i w_i``) and divides by the row's spread about its mean, so the relative error of
   row ``i`` becomes ``sqrt(E||dC_i||^2 (N-2)/N / v_i)``: a large common offset (``m_i`` large next to
   ``sqrt(v_i/N)``) amplifies it. RMSNorm: ``(N-1)/N`` over the full row energy. ReLU: as none.
6. Row quantile. A measured row error is a ratio of two sums of ``N`` random terms (noise energy
   over signal energy), so its square fluctuates as an ``F(N, N)`` variable about the prediction;
   the predicted p99 over rows mixes each row's predicted error with that fluctuation.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy import stats as _st

from ..formats import get_format
from .sites import Candidate, Site
from .stats import F_BINS, R_BINS, R_MIN, R_PER_BINADE, SiteStats, f_centers, r_centers

__all__ = ["Prediction", "predict", "relative_noise", "operand_noise"]

U_FP32 = 2.0 ** -24


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Predicted error of one candidate at one site (all after the following operation)."""

    rel_error: float
    p99_row_error: float
    rho_a: float            # noise-to-signal ratio of A (energy weighted)
    rho_b: float
    overflow_frac_a: float  # fraction of nonzero elements beyond max (saturated)
    overflow_frac_b: float
    flush_frac_a: float     # fraction of nonzero elements flushed to zero
    flush_frac_b: float
    amplification: float    # error after the following op over error before it

    def to_dict(self) -> dict:
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


@functools.lru_cache(maxsize=None)
def _grid(fmt: str) -> tuple[np.ndarray, float, float]:
    f = get_format(fmt)
    pos = np.array([float(v) for v in f.positive_values])
    return np.concatenate([[0.0], pos]), float(pos[-1]), float(pos[0])


def relative_noise(log2v: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rho, flushed, saturated) for scaled magnitudes ``2^log2v`` in format ``fmt``."""
    grid, fmax, fmin = _grid(fmt)
    v = np.exp2(log2v)
    sat = v > fmax
    flush = v < fmin / 2
    vc = np.clip(v, fmin / 2, fmax)
    j = np.clip(np.searchsorted(grid, vc, side="right") - 1, 0, grid.size - 2)
    step = grid[j + 1] - grid[j]
    rho = step * step / (12.0 * vc * vc)
    rho = np.where(sat, ((v - fmax) / v) ** 2, rho)
    rho = np.where(flush, 1.0, rho)
    return rho, flush, sat


def _shift(cand: Candidate, fmt: str, scale_log2_of_amax=None) -> np.ndarray:
    """log2(x/scale) - r' for each frac(log2 amax) bucket (r' = log2|x| - floor(log2 amax))."""
    fi = get_format(fmt).finfo
    fr = f_centers()
    if cand.scaling == "mx":
        return np.full(F_BINS, float(math.floor(math.log2(fi.max))))
    lf = math.log2(fi.scale_target)  # amax maps to the format's scale target
    if cand.pow2:
        return -np.ceil(fr - lf)
    return lf - fr


def operand_noise(hc, he, cand: Candidate, fmt: str, extra_shift: float = 0.0):
    """(rho, overflow_frac, flush_frac) of an operand from its 2-D histogram for ``cand``."""
    lv = r_centers()[:, None] + _shift(cand, fmt)[None, :] + extra_shift
    rho, fl, sat = relative_noise(lv, fmt)
    n, e = hc.sum(), he.sum()
    if n <= 0 or e <= 0:
        return 0.0, 0.0, 0.0
    return float((he * rho).sum() / e), float(hc[sat].sum() / n), float(hc[fl].sum() / n)


def _row_rho(st, cand: Candidate, fmt: str, row_amax: np.ndarray, group_amax: np.ndarray,
             amax_override=None) -> np.ndarray:
    """Per-row rho: the pooled row shape (histogram relative to each row's amax) shifted by
    D_i = log2(row_amax_i / scale_i)."""
    from .emulate import scales_for

    he = st.hist_energy["channel"]
    # collapse (r', frac) to r_row = r' - frac on the 1/16 grid: index i - j
    t = (np.arange(R_BINS)[:, None] - (np.arange(F_BINS)[None, :] * R_PER_BINADE) // F_BINS)
    off = R_PER_BINADE
    e_row = np.bincount((t + off).ravel(), weights=he.ravel(), minlength=R_BINS + off)
    r_row = R_MIN + (np.arange(e_row.size) - off + 0.5) / R_PER_BINADE
    tot = e_row.sum()
    if tot <= 0:
        return np.zeros(row_amax.shape)
    ga = group_amax if amax_override is None else np.full(row_amax.shape, amax_override)
    s = scales_for(ga, fmt, pow2=cand.pow2)
    with np.errstate(divide="ignore"):
        d = np.log2(np.where(row_amax > 0, row_amax, 1.0) / s)
    # evaluate rho(D) on a 1/16 grid covering the needed range, then interpolate
    lo, hi = math.floor(d.min() * 16) / 16 - 1 / 16, math.ceil(d.max() * 16) / 16 + 1 / 16
    dg = np.arange(lo, hi + 1e-9, 1 / 16)
    keep = e_row > 0
    rho, _, _ = relative_noise(r_row[keep][None, :] + dg[:, None], fmt)
    rho_d = (rho * e_row[keep][None, :]).sum(axis=1) / tot
    out = np.interp(d, dg, rho_d)
    return np.where(row_amax > 0, out, 0.0)


def predict(site: Site, ss: SiteStats, cand: Candidate, *, margin: float = 1.0) -> Prediction:
    """Predict the error of ``cand`` at ``site`` from ``ss`` (the statistics of the last batch).

    ``margin`` multiplies the history amax for delayed scaling.
    """
    a, b = ss.a, ss.b
    n = b.shape[0]
    k = a.shape[1]
    w, m, v = ss.row_w, ss.row_m, np.maximum(ss.row_v, 0.0)
    ref_row = n * m * m + v
    if cand.is_high:
        rho_a = np.zeros(a.shape[0])
        rb = 0.0
        ofa = ofb = fla = flb = 0.0
        ra = 0.0
    else:
        g = cand.scaling
        ext_a = ext_b = 0.0
        over_a = over_b = None
        if cand.delayed:
            over_a, over_b = a.history_amax(margin), b.history_amax(margin)
            ext_a = _delayed_shift(a, cand, cand.fmt_a, over_a)
            ext_b = _delayed_shift(b, cand, cand.fmt_b, over_b)
        ra, ofa, fla = operand_noise(a.hist_count[g], a.hist_energy[g], cand, cand.fmt_a, ext_a)
        rb, ofb, flb = operand_noise(b.hist_count[g], b.hist_energy[g], cand, cand.fmt_b, ext_b)
        if g in ("tensor", "channel") or g.startswith("tile:"):
            ga = _row_group_amax(a, g)
            rho_a = _row_rho(a, cand, cand.fmt_a, a.row_amax, ga, over_a)
        else:
            rho_a = np.full(a.shape[0], ra)
    acc = (U_FP32 ** 2 * k / 6.0) if cand.accumulate == "fp32" else 0.0
    d_row = (rho_a + rb + rho_a * rb) * w + acc * ref_row
    follow = site.follow
    if follow == "layernorm":
        # A's noise times B's column means is the same in every column of a row: an offset that
        # LayerNorm removes. Only its product with B's spread about the means survives.
        d_row = rho_a * v + (rb + rho_a * rb) * w + acc * ref_row
        den = v
        fac = max(n - 2, 1) / n
    elif follow == "rmsnorm":
        den, fac = ref_row, (n - 1) / n
    else:
        den, fac = ref_row, 1.0
    ok = den > 0
    rel2 = np.where(ok, d_row * fac / np.where(ok, den, 1.0), 0.0)
    if follow in ("layernorm", "rmsnorm"):
        rel = math.sqrt(float(rel2.mean()))
    else:
        rel = math.sqrt(float(d_row.sum() / max(ref_row.sum(), 1e-300)))
    raw = math.sqrt(float(d_row.sum() / max(ref_row.sum(), 1e-300)))
    p99 = _p99(np.sqrt(rel2), n)
    return Prediction(rel, p99, float(ra), float(rb), ofa, ofb, fla, flb,
                      rel / raw if raw > 0 else 1.0)


def _delayed_shift(st, cand, fmt, amax_used) -> float:
    """Extra log2 shift of x/scale when the scale comes from ``amax_used`` instead of the amax."""
    if amax_used <= 0 or st.amax <= 0:
        return 0.0
    from .emulate import scales_for

    s_used = float(scales_for(amax_used, fmt, pow2=cand.pow2))
    s_now = float(scales_for(st.amax, fmt, pow2=cand.pow2))
    return math.log2(s_now / s_used)


def _row_group_amax(st, g: str) -> np.ndarray:
    ra = st.row_amax
    if g == "tensor":
        return np.full(ra.shape, ra.max(initial=0.0))
    if g == "channel":
        return ra
    b = int(g.split(":")[1])
    pad = -ra.size % b
    band = np.pad(ra, (0, pad)).reshape(-1, b).max(axis=1)
    return np.repeat(band, b)[: ra.size]


_Q = np.linspace(0.025, 0.975, 20)


def _p99(rel_rows: np.ndarray, n: int) -> float:
    """99th percentile over rows of the measured row error, mixing in its F(n, n) spread."""
    q = np.sqrt(_st.f.ppf(_Q, n, n))
    return float(np.percentile((rel_rows[:, None] * q[None, :]).ravel(), 99))
