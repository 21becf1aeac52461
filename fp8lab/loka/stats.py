"""Streaming statistics of GEMM operands, cheap enough for every training step.

Per operand (a 2-D array, rows x K): amax per tensor, row and column with a history; streaming
mean and variance; per column energy and mean (the noise model's GEMM propagation needs them);
and, per scaling granularity, a 2-D histogram of ``log2|x|`` relative to ``2^floor(log2 amax)`` of
the element's scaling group, indexed also by the fractional part of ``log2 amax``. That one table
gives the distribution of ``x / scale`` for every format and every scale rule (``amax / fmax``,
power-of-two, E8M0), so would-overflow / would-flush fractions and the rounding noise of any
candidate are read from it without touching the data again.

Histograms are filled from a random sample of at most ``sample`` elements per step (amax is always
exact: scales depend on it) and decay by ``forget`` per step, so they follow a drifting site.

>>> import numpy as np
>>> from fp8lab.loka.stats import OperandStats
>>> st = OperandStats(granularities=("tensor",))
>>> st.update(np.full((4, 8), 2.0))
>>> st.amax, st.nan_count
(2.0, 0)
"""

from __future__ import annotations

import collections

import numpy as np

from .emulate import group_amax

__all__ = ["OperandStats", "SiteStats", "R_BINS", "R_MIN", "F_BINS"]

#: Histogram resolution: 1/16 binade in r = log2|x| - floor(log2 amax_group), r in [R_MIN, 1).
R_PER_BINADE = 16
R_MIN = -48
R_BINS = (1 - R_MIN) * R_PER_BINADE
#: Buckets of frac(log2 amax_group).
F_BINS = 16


def r_centers() -> np.ndarray:
    return R_MIN + (np.arange(R_BINS) + 0.5) / R_PER_BINADE


def f_centers() -> np.ndarray:
    return (np.arange(F_BINS) + 0.5) / F_BINS


class OperandStats:
    """Streaming statistics of one operand.

    Parameters
    ----------
    granularities : sequence of str
        Scaling granularities to keep histograms for (``channel`` is always kept: per-row
        predictions use its shape).
    history : int
        Length of the amax history (tensor, row and column).
    sample : int
        Elements sampled per step for the histograms.
    forget : float
        Decay of the histograms and moments per step (1.0 = no forgetting).
    seed : int
    """

    def __init__(self, granularities=("tensor", "channel", "tile:128", "block:128", "mx"), *,
                 history: int = 16, sample: int = 1 << 14, forget: float = 0.9, seed: int = 0):
        g = list(dict.fromkeys(list(granularities) + ["channel"]))
        self.granularities = tuple(g)
        self.sample = int(sample)
        self.forget = float(forget)
        self._rng = np.random.default_rng(seed)
        self.amax_history = collections.deque(maxlen=history)
        self.row_amax_history = collections.deque(maxlen=history)
        self.col_amax_history = collections.deque(maxlen=history)
        self.hist_count = {k: np.zeros((R_BINS, F_BINS)) for k in self.granularities}
        self.hist_energy = {k: np.zeros((R_BINS, F_BINS)) for k in self.granularities}
        self.steps = 0
        self.nan_count = 0
        self.inf_count = 0
        self.n = 0.0           # decayed element count
        self.mean = 0.0
        self.var = 0.0
        # latest batch (the noise model predicts the batch it is given)
        self.col_energy = None  # sum over rows of x^2, per column
        self.col_mean = None
        self.row_amax = None
        self.col_amax = None
        self.shape = None

    # ------------------------------------------------------------------ update
    def update(self, x) -> None:
        """Fold one batch (2-D array; CuPy arrays are copied to the host) into the statistics."""
        if hasattr(x, "get") and not isinstance(x, np.ndarray):  # CuPy
            x = x.get()
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"operands are 2-D (rows x K), got shape {x.shape}")
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        self.shape = x.shape
        self.steps += 1
        absx = np.abs(x)
        finite = np.isfinite(absx)
        if not finite.all():
            self.nan_count += int(np.isnan(absx).sum())
            self.inf_count += int(np.isinf(absx).sum())
            absx = np.where(finite, absx, 0.0)
            x = np.where(finite, x, 0.0)
        row_amax = absx.max(axis=1)
        col_amax = absx.max(axis=0)
        amax = float(row_amax.max(initial=0.0))
        self.amax_history.append(amax)
        self.row_amax_history.append(row_amax)
        self.col_amax_history.append(col_amax)
        self.row_amax, self.col_amax = row_amax, col_amax
        x64 = x.astype(np.float64, copy=False)
        self.col_energy = np.einsum("ij,ij->j", x64, x64)
        self.col_mean = x64.mean(axis=0)
        # streaming moments with exponential forgetting (Chan's merge of two groups)
        nb = float(x.size)
        mb = float(self.col_mean.mean())
        vb = float(self.col_energy.sum()) / nb - mb * mb
        na = self.n * self.forget
        tot = na + nb
        d = mb - self.mean
        self.var = (na * self.var + nb * vb + d * d * na * nb / tot) / tot
        self.mean += d * nb / tot
        self.n = tot
        # histograms on a sample
        size = x.size
        if size <= self.sample:
            idx = None
            xs, axs = x64.reshape(-1), absx.reshape(-1)
        else:
            idx = self._rng.integers(0, size, self.sample)
            xs, axs = x64.reshape(-1)[idx], absx.reshape(-1)[idx]
        nz = axs > 0
        lx = np.log2(np.where(nz, axs, 1.0))
        e2 = xs * xs
        for g in self.granularities:
            if g == "tensor":
                ga = np.full(xs.shape, amax)
            elif g == "channel":
                ga = row_amax[(np.arange(size) if idx is None else idx) // x.shape[1]]
            else:
                ga = np.broadcast_to(group_amax(absx, g), x.shape).reshape(-1)
                ga = ga if idx is None else ga[idx]
            la = np.log2(np.where(ga > 0, ga, 1.0))
            fl = np.floor(la)
            r = lx - fl
            ri = np.clip(np.floor((r - R_MIN) * R_PER_BINADE), 0, R_BINS - 1).astype(np.int64)
            fi = np.minimum(((la - fl) * F_BINS).astype(np.int64), F_BINS - 1)
            flat = (ri * F_BINS + fi)[nz]
            c = np.bincount(flat, minlength=R_BINS * F_BINS).reshape(R_BINS, F_BINS)
            en = np.bincount(flat, weights=e2[nz], minlength=R_BINS * F_BINS).reshape(R_BINS, F_BINS)
            self.hist_count[g] *= self.forget
            self.hist_energy[g] *= self.forget
            self.hist_count[g] += c
            self.hist_energy[g] += en

    # ------------------------------------------------------------------ queries
    @property
    def amax(self) -> float:
        return self.amax_history[-1] if self.amax_history else 0.0

    def history_amax(self, margin: float = 1.0) -> float:
        """Max of the amax history before the latest batch, times ``margin``: the amax that
        delayed scaling uses for the latest batch (its own amax when there is no history)."""
        h = list(self.amax_history)[:-1] or list(self.amax_history)
        return max(h, default=0.0) * margin

    def amax_jump(self) -> float:
        """Latest amax over the max of the previous history (inf when the history was all zero)."""
        if len(self.amax_history) < 2:
            return 1.0
        prev = max(list(self.amax_history)[:-1])
        return self.amax / prev if prev > 0 else (np.inf if self.amax > 0 else 1.0)

    def log2_histogram(self, granularity: str = "tensor") -> tuple[np.ndarray, np.ndarray]:
        """(bin left edges, counts) of ``log2|x| - floor(log2 amax_group)``."""
        edges = R_MIN + np.arange(R_BINS) / R_PER_BINADE
        return edges, self.hist_count[granularity].sum(axis=1)


class SiteStats:
    """Statistics of a site: both operands, plus the per-row GEMV terms the noise model needs.

    Per row ``i`` of ``C = A @ B.T``: ``w_i = sum_k a_ik^2 ||B_:k||^2`` (the output energy the
    operand noise is weighted by), ``m_i = A_i . mean(B)`` (the row mean of C, exact) and
    ``v_i = sum_k a_ik^2 var_k(B) N`` (the row energy of C about its mean, diagonal approximation).
    These cost O(MK), not the O(MNK) of the GEMM.
    """

    def __init__(self, granularities=("tensor", "channel", "tile:128", "block:128", "mx"), **kw):
        seed = kw.pop("seed", 0)
        self.a = OperandStats(granularities, seed=seed, **kw)
        self.b = OperandStats(granularities, seed=seed + 1, **kw)
        self.row_w = self.row_m = self.row_v = None

    def update(self, a, b) -> None:
        if hasattr(a, "get") and not isinstance(a, np.ndarray):
            a = a.get()
        if hasattr(b, "get") and not isinstance(b, np.ndarray):
            b = b.get()
        a, b = np.asarray(a), np.asarray(b)
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"A is {a.shape} and B is {b.shape}: K differs (C = A @ B.T)")
        self.a.update(a)
        self.b.update(b)
        a64 = np.nan_to_num(a.astype(np.float64, copy=False), nan=0.0, posinf=0.0, neginf=0.0)
        a2 = a64 * a64
        n = b.shape[0]
        cb = self.b.col_energy
        mub = self.b.col_mean
        self.row_w = a2 @ cb
        self.row_m = a64 @ mub
        self.row_v = a2 @ (cb - n * mub * mub)
