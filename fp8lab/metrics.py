"""Error metrics of a quantized (or any approximate) tensor against a float64 reference.

:func:`error_metrics` returns every number as one typed record. Definitions (docs/metrics.md):
with ``x`` the reference and ``y`` the approximation, both in float64, the *compared set* is the
elements where ``x`` is finite; NaN and +-Inf in ``x`` are counted (``nan_count``, ``inf_count``)
and left out of everything else. ``e = y - x`` over the compared set (infinite where ``y`` is
NaN or +-Inf: an overflow is an unbounded error, and the metrics say so).

>>> import numpy as np, fp8lab
>>> from fp8lab.metrics import error_metrics
>>> x = np.array([[1.0, 2.0, 3.0, 1000.0], [0.001, -0.5, 0.25, 0.0]])
>>> m = error_metrics(x, fp8lab.quantize(x, "e4m3", scaling="channel,pow2"))
>>> m.n, m.underflow_frac, m.overflow_frac, m.ulp_max <= 0.5
(8, 0.0, 0.0, True)
>>> round(m.sqnr_db, 1), round(m.max_rel_error, 4)
(32.4, 0.024)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .formats import Format, get_format
from .qtensor import QTensor

__all__ = ["ErrorMetrics", "error_metrics", "ulp_distance"]


@dataclasses.dataclass(frozen=True)
class ErrorMetrics:
    """Error of an approximation ``y`` of a reference ``x`` (see :func:`error_metrics`)."""

    n: int
    nan_count: int
    inf_count: int
    sqnr_db: float
    rel_error: float
    cosine: float
    max_abs_error: float
    max_rel_error: float
    row_p50_error: float
    row_p90_error: float
    p99_row_error: float
    ulp_max: float | None
    overflow_frac: float
    saturated_frac: float | None
    underflow_frac: float

    @property
    def row_p99_error(self) -> float:
        """Alias of :attr:`p99_row_error`."""
        return self.p99_row_error

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _ratio(num: float, den: float) -> float:
    """num / den with 0/0 = 0 and x/0 = inf."""
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


def ulp_distance(x, y, fmt, scale=1.0) -> np.ndarray:
    """``|y - x| / (scale * ulp(|x| / scale))`` element-wise, in units of the format's spacing.

    ``ulp(v)`` is the spacing of the format's grid at ``v``: ``2^(e - m(e))`` in binade
    ``2^e <= v < 2^(e+1)`` with ``m(e)`` mantissa bits; below the smallest value's binade, the
    smallest value; above the largest binade, the largest binade's spacing. Correct rounding to
    nearest gives at most 0.5, toward zero or stochastic less than 1.
    """
    f = get_format(fmt)
    b = f.binades
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    scale = np.asarray(scale, np.float64)
    v = np.abs(x) / scale
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where(v > 0, v, 1.0))).astype(np.int64)
    # log2 may be off by one next to powers of two: correct with exact comparisons
    e = np.where(np.ldexp(1.0, e) > v, e - 1, e)
    e = np.where(np.ldexp(1.0, e + 1) <= v, e + 1, e)
    e = np.clip(e, b.e_low, b.e_max)
    step = np.ldexp(1.0, e - b.mbits[e - b.e_low])
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(y - x) / (scale * step)
    return np.where(np.isfinite(y), d, np.inf)


def error_metrics(reference, qt_or_approx, *, fmt=None) -> ErrorMetrics:
    """All error metrics of ``qt_or_approx`` against ``reference`` (compared in float64).

    Parameters
    ----------
    reference : array_like
        The exact values ``x`` (any float dtype; NaN/Inf are counted and excluded).
    qt_or_approx : QTensor or array_like
        The approximation ``y``: a QTensor (dequantized exactly) or an array of ``x``'s shape.
    fmt : str or Format, optional
        The format of an approximation given as an array (scale 1), for ``ulp_max`` and
        ``saturated_frac``; with a QTensor it must be None or the QTensor's format.

    Returns
    -------
    ErrorMetrics
        ``n``: compared elements (finite ``x``). ``sqnr_db = 10 log10(sum x^2 / sum e^2)``
        (+inf when ``e`` is 0). ``rel_error = ||e|| / ||x||`` (Frobenius). ``cosine =
        <x, y> / (||x|| ||y||)`` (1 if both are 0, 0 if one is). ``max_abs_error = max |e|``,
        ``max_rel_error = max |e| / |x|`` over ``x != 0``. Rows are all axes but the last; the
        error of a row is ``||e_row|| / ||x_row||``; ``row_p50/p90_error``, ``p99_row_error`` are
        its percentiles (numpy's linear interpolation). ``ulp_max``: max :func:`ulp_distance`
        (None without a format). ``overflow_frac``: share of ``y`` that is NaN or +-Inf.
        ``saturated_frac``: share with ``|x| >= s * (max + overflow) / 2`` (round to nearest
        would pass the largest finite value ``max``; ``overflow`` is the next grid point above it)
        and ``|y| == max * s`` (None without a format). ``underflow_frac``: share with ``x != 0`` and ``y == 0``. Every empty or 0/0
        quantity is 0.
    """
    x = np.asarray(reference)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        x = x.astype(np.float64)
    x = x.astype(np.float64)
    scale = 1.0
    if isinstance(qt_or_approx, QTensor):
        qt = qt_or_approx
        if fmt is not None and get_format(fmt) is not qt.format:
            raise ValueError(f"fmt={get_format(fmt).name!r} but the QTensor is {qt.format.name!r}")
        f: Format | None = qt.format
        y = qt.dequantize(np.float64)
        scale = qt.expanded_scales().astype(np.float64)
    else:
        f = get_format(fmt) if fmt is not None else None
        y = np.asarray(qt_or_approx).astype(np.float64)
    if y.shape != x.shape:
        raise ValueError(f"reference has shape {x.shape} but the approximation has shape {y.shape}; "
                         "expected the same shape")
    scale = np.broadcast_to(np.asarray(scale, np.float64), x.shape)
    nan_count = int(np.isnan(x).sum())
    inf_count = int(np.isinf(x).sum())
    ok = np.isfinite(x)
    n = int(ok.sum())
    xs, ys, ss = x[ok], y[ok], scale[ok]
    yfinite = np.isfinite(ys)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(yfinite, ys - xs, np.inf)
        ae = np.abs(e)
        sig = float(np.sum(xs * xs))
        noise = float(np.sum(ae * ae))
        dot = float(np.sum(xs * ys)) if yfinite.all() else math.nan
        ny = float(np.sqrt(np.sum(ys * ys))) if yfinite.all() else math.inf
    nx = math.sqrt(sig)
    if noise == 0:
        sqnr = math.inf
    elif sig == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(sig / noise) if math.isfinite(noise) else -math.inf
    rel = _ratio(math.sqrt(noise), nx)
    if nx == 0 and ny == 0:
        cosine = 1.0
    elif nx == 0 or ny == 0:
        cosine = 0.0
    elif not math.isfinite(ny):
        cosine = math.nan
    else:
        den = sig * ny * ny
        den = math.sqrt(den) if math.isfinite(den) and den > 0 else nx * ny
        cosine = max(-1.0, min(1.0, dot / den))
    max_abs = float(ae.max()) if n else 0.0
    nz = xs != 0
    max_rel = float((ae[nz] / np.abs(xs[nz])).max()) if nz.any() else 0.0
    # per-row relative errors (rows: all axes but the last)
    if x.ndim == 0:
        rows_x, rows_e = xs.reshape(1, -1), e.reshape(1, -1)
    else:
        xr = np.where(ok, x, 0.0).reshape(-1, x.shape[-1]) if x.size else np.zeros((0, 1))
        er = np.zeros_like(xr)
        er_full = np.zeros(x.shape)
        with np.errstate(invalid="ignore", over="ignore"):
            er_full[ok] = e
        er = er_full.reshape(xr.shape) if x.size else er
        rows_x, rows_e = xr, er
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        rx = np.sqrt(np.sum(rows_x * rows_x, axis=1))
        re = np.sqrt(np.sum(rows_e * rows_e, axis=1))
        row_err = np.where(rx > 0, re / np.where(rx > 0, rx, 1.0), np.where(re > 0, np.inf, 0.0))
    if row_err.size:
        with np.errstate(invalid="ignore"):  # inf - inf while interpolating between inf rows
            pct = np.percentile(row_err, [50, 90, 99])
        p50, p90, p99 = (math.inf if math.isnan(v) else float(v) for v in pct)
    else:
        p50 = p90 = p99 = 0.0
    overflow = _ratio(float((~yfinite).sum()), n)
    underflow = _ratio(float((nz & (ys == 0)).sum()), n)
    ulp_max = sat = None
    if f is not None:
        ulp_max = float(ulp_distance(xs, ys, f, ss).max()) if n else 0.0
        top = f.finfo.max * ss
        past = (f.finfo.max + float(f.overflow_value)) / 2 * ss
        sat = _ratio(float(((np.abs(xs) >= past) & (np.abs(ys) == top)).sum()), n)
    return ErrorMetrics(n=n, nan_count=nan_count, inf_count=inf_count, sqnr_db=sqnr, rel_error=rel,
                        cosine=cosine, max_abs_error=max_abs, max_rel_error=max_rel,
                        row_p50_error=p50, row_p90_error=p90, p99_row_error=p99, ulp_max=ulp_max,
                        overflow_frac=overflow, saturated_frac=sat, underflow_frac=underflow)
