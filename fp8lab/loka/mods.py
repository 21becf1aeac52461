"""Mods: changes that make more sites safe or cheaper.

- :func:`choose_scaling`: the coarsest granularity whose predicted error meets the budget.
- :class:`DelayedScaling`: scale from an amax history with a margin (no amax pass before the GEMM).
- :func:`pow2_scale`: power-of-two scales (rescaling is exact: only the exponent moves).
- :func:`recenter_for_layernorm`: exact re-parameterization of the weight before a LayerNorm.
- :func:`row_scale_is_free`: per-row de-scaling before LayerNorm/RMSNorm can be dropped.
- :func:`gate`: precision gating (first layer, logit layer, tiny GEMMs stay in high precision).

>>> import numpy as np
>>> from fp8lab.loka.mods import recenter_for_layernorm, DelayedScaling
>>> w = np.array([[1.0, 2.0], [3.0, 6.0]])
>>> recenter_for_layernorm(w)[0].tolist()
[[-1.0, -2.0], [1.0, 2.0]]
>>> d = DelayedScaling("e4m3", history=4, margin=2.0)
>>> d.update(3.5); d.update(1.0)
>>> d.scale() == 2 * 3.5 / 448
True
"""

from __future__ import annotations

import collections
import math

import numpy as np

from .emulate import scales_for
from .noise import predict
from .sites import GRANULARITIES, Candidate, Site

__all__ = ["choose_scaling", "DelayedScaling", "pow2_scale", "recenter_for_layernorm",
           "row_scale_is_free", "gate", "TINY_FLOPS"]

#: GEMMs below this many flops stay in high precision: the casts cost more than the GEMM saves.
TINY_FLOPS = 2 * 64 * 64 * 64


def choose_scaling(site: Site, stats, fmt: str, tau: float, *, tau_row=None,
                   granularities=GRANULARITIES, fmt_b=None, pow2=False):
    """The coarsest granularity whose predicted error (and p99 row error) meets the budget.

    Returns ``(candidate, prediction)`` or ``(None, None)`` when none does.
    """
    for g in granularities:
        c = Candidate(fmt, fmt_b or fmt, g, pow2=pow2)
        p = predict(site, stats, c)
        if p.rel_error <= tau and (tau_row is None or p.p99_row_error <= tau_row):
            return c, p
    return None, None


def pow2_scale(amax, fmt) -> np.ndarray:
    """``2^ceil(log2(amax / T))`` (T the scale target): the least power of two mapping amax to <= T."""
    return scales_for(amax, fmt, pow2=True)


class DelayedScaling:
    """Per-tensor scale from the max of the last ``history`` amaxes, times ``margin``.

    The current step uses the scale of the steps before it (``scale()`` is read before
    ``update()`` in a training loop); values beyond the range then saturate, which the probe counts.
    """

    def __init__(self, fmt, *, history: int = 16, margin: float = 1.0, pow2: bool = False):
        if history < 1 or margin <= 0:
            raise ValueError("history must be >= 1 and margin > 0")
        self.fmt, self.margin, self.pow2 = fmt, float(margin), pow2
        self.amaxes = collections.deque(maxlen=history)

    def update(self, amax: float) -> None:
        if math.isfinite(amax):
            self.amaxes.append(float(amax))

    def amax(self) -> float:
        return max(self.amaxes, default=0.0) * self.margin

    def scale(self) -> float:
        return float(scales_for(self.amax(), self.fmt, pow2=self.pow2))


def recenter_for_layernorm(w, bias=None):
    """Remove from a weight ``W`` (N outputs x K inputs) its mean over the output features.

    ``C = A @ W.T + bias`` then changes by the same amount ``A @ u`` in every column of a row, which
    LayerNorm (over the N outputs) removes exactly; the 8-bit GEMM no longer carries the common
    offset that LayerNorm would amplify the error of. Not valid before RMSNorm (it keeps offsets).
    Returns ``(w_new, bias_new)``.
    """
    w = np.asarray(w, dtype=np.float64)
    u = w.mean(axis=0, keepdims=True)
    nb = None if bias is None else np.asarray(bias, np.float64) - np.mean(bias)
    return w - u, nb


def row_scale_is_free(follow: str) -> bool:
    """A positive per-row factor of C is removed by LayerNorm and RMSNorm (eps aside), so the
    de-scaling of A's per-row scales can be skipped before them."""
    return follow in ("layernorm", "rmsnorm")


def gate(site: Site, *, tiny_flops: int = TINY_FLOPS, min_dim: int = 16) -> str | None:
    """Why ``site`` must stay in high precision, or ``None``."""
    if site.position == "first":
        return "first layer (input features are not normalized)"
    if site.position == "logit":
        return "logit layer (errors reach the loss directly)"
    if site.flops < tiny_flops:
        return f"tiny GEMM ({site.flops} flops < {tiny_flops})"
    if min(site.m, site.n, site.k) < min_dim:
        return f"a dimension below {min_dim} (m={site.m}, n={site.n}, k={site.k})"
    return None
