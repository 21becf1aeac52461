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

from .codecs import decode
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
    if isinstance(qt_or_approx, QTensor):
        qt = qt_or_approx
        if fmt is not None and get_format(fmt) is not qt.format:
            raise ValueError(f"fmt={get_format(fmt).name!r} but the QTensor is {qt.format.name!r}")
        f: Format | None = qt.format
        yshape = qt.shape
    else:
        qt = None
        f = get_format(fmt) if fmt is not None else None
        y_all = np.asarray(qt_or_approx)
        yshape = y_all.shape
    if tuple(yshape) != x.shape:
        raise ValueError(f"reference has shape {x.shape} but the approximation has shape "
                         f"{tuple(yshape)}; expected the same shape")
    acc = _Accumulator(f, x.ndim)
    for xs, ys, ss in _chunks(x, qt, None if qt is not None else y_all):
        acc.add(xs, ys, ss)
    return acc.result()


#: elements per chunk: the float64 temporaries of one chunk stay near 14 MiB, so the peak
#: memory of error_metrics is the inputs plus a constant (the per-row errors aside).
CHUNK_ELEMENTS = 1 << 17


def _chunks(x: np.ndarray, qt: "QTensor | None", y: "np.ndarray | None"):
    """(x, y, scale) chunks along the first axis, in float64, each of whole rows."""
    if x.ndim == 0:
        yield from _chunks(x.reshape(1), _reshaped(qt), None if y is None else np.asarray(y).reshape(1))
        return
    n0 = x.shape[0]
    per_row = max(1, x.size // max(n0, 1))
    step = max(1, CHUNK_ELEMENTS // per_row)
    b0 = qt.scaling.block_shape(qt.shape)[0] if qt is not None else 1
    step = max(b0, step - step % b0)
    for i0 in range(0, n0, step):
        i1 = min(n0, i0 + step)
        xs = x[i0:i1].astype(np.float64)
        if qt is not None:
            bs = qt.scaling.block_shape(qt.shape)
            sc = qt.scales[i0 // bs[0]: -(-i1 // bs[0])]
            for ax, b in enumerate(bs):
                sc = np.repeat(sc, b, axis=ax)
            sc = sc[(slice(0, i1 - i0),) + tuple(slice(0, d) for d in qt.shape[1:])].astype(np.float64)
            ys = decode(qt.codes[i0:i1], qt.format, dtype=np.float64) * sc  # exact
        else:
            sc = np.ones(1)
            with np.errstate(invalid="ignore"):
                ys = y[i0:i1].astype(np.float64)
        yield xs, ys, np.broadcast_to(sc, xs.shape)


def _reshaped(qt):
    """A 0-d QTensor seen as a 1-element vector (the same codes and scale)."""
    if qt is None:
        return None
    return dataclasses.replace(qt, codes=qt.codes.reshape(1), scales=qt.scales.reshape(1))


class _Accumulator:
    """Sums, maxima, counts and per-row errors over chunks; :meth:`result` finishes."""

    def __init__(self, f: "Format | None", ndim: int):
        self.f, self.ndim = f, ndim
        self.n = self.nan_count = self.inf_count = 0
        self.sig = self.noise = self.dot = self.yy = 0.0
        self.y_all_finite = True
        self.max_abs = self.max_rel = 0.0
        self.over = self.under = self.sat = 0
        self.ulp_max = 0.0
        self.row_x: list[np.ndarray] = []
        self.row_e: list[np.ndarray] = []
        self.flat_x = self.flat_e = 0.0  # the single row of a 0-d or 1-d reference

    def add(self, x, y, s):
        nan = np.isnan(x)
        self.nan_count += int(nan.sum())
        self.inf_count += int(np.isinf(x).sum())
        ok = np.isfinite(x)
        xs, ys, ss = x[ok], y[ok], s[ok]
        self.n += xs.size
        yfinite = np.isfinite(ys)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.where(yfinite, ys - xs, np.inf)
            ae = np.abs(e)
            self.sig += float(np.sum(xs * xs))
            self.noise += float(np.sum(ae * ae))
            if yfinite.all():
                self.dot += float(np.sum(xs * ys))
                self.yy += float(np.sum(ys * ys))
            else:
                self.y_all_finite = False
        if xs.size:
            self.max_abs = max(self.max_abs, float(ae.max()))
        nz = xs != 0
        if nz.any():
            self.max_rel = max(self.max_rel, float((ae[nz] / np.abs(xs[nz])).max()))
        self.over += int((~yfinite).sum())
        self.under += int((nz & (ys == 0)).sum())
        if self.f is not None and xs.size:
            self.ulp_max = max(self.ulp_max, float(ulp_distance(xs, ys, self.f, ss).max()))
            top = self.f.finfo.max * ss
            past = (self.f.finfo.max + float(self.f.overflow_value)) / 2 * ss
            self.sat += int(((np.abs(xs) >= past) & (np.abs(ys) == top)).sum())
        # per-row errors (rows: all axes but the last); non-finite x counts as 0 in its row
        with np.errstate(invalid="ignore", over="ignore"):
            er = np.zeros(x.shape)
            er[ok] = e
            xr = np.where(ok, x, 0.0)
            if self.ndim <= 1:
                self.flat_x += float(np.sum(xr * xr))
                self.flat_e += float(np.sum(er * er))
            elif x.size:
                xr, er = xr.reshape(-1, x.shape[-1]), er.reshape(-1, x.shape[-1])
                self.row_x.append(np.sum(xr * xr, axis=1))
                self.row_e.append(np.sum(er * er, axis=1))

    def result(self) -> ErrorMetrics:
        n, sig, noise = self.n, self.sig, self.noise
        nx = math.sqrt(sig)
        ny = math.sqrt(self.yy) if self.y_all_finite else math.inf
        dot = self.dot if self.y_all_finite else math.nan
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
        if self.ndim <= 1:
            rx2, re2 = np.array([self.flat_x]), np.array([self.flat_e])
        elif self.row_x:
            rx2, re2 = np.concatenate(self.row_x), np.concatenate(self.row_e)
        else:
            rx2 = re2 = np.zeros(0)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            rx, re = np.sqrt(rx2), np.sqrt(re2)
            row_err = np.where(rx > 0, re / np.where(rx > 0, rx, 1.0), np.where(re > 0, np.inf, 0.0))
        if row_err.size:
            with np.errstate(invalid="ignore"):  # inf - inf while interpolating between inf rows
                pct = np.percentile(row_err, [50, 90, 99])
            p50, p90, p99 = (math.inf if math.isnan(v) else float(v) for v in pct)
        else:
            p50 = p90 = p99 = 0.0
        has_f = self.f is not None
        return ErrorMetrics(
            n=n, nan_count=self.nan_count, inf_count=self.inf_count, sqnr_db=sqnr, rel_error=rel,
            cosine=cosine, max_abs_error=self.max_abs, max_rel_error=self.max_rel,
            row_p50_error=p50, row_p90_error=p90, p99_row_error=p99,
            ulp_max=(self.ulp_max if n else 0.0) if has_f else None,
            overflow_frac=_ratio(float(self.over), n),
            saturated_frac=_ratio(float(self.sat), n) if has_f else None,
            underflow_frac=_ratio(float(self.under), n))
