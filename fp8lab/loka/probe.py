"""The probe: per site, streaming statistics, measured and predicted error per candidate, and the
posterior that turns measurements into Safe / Unsafe.

>>> import numpy as np
>>> from fp8lab.loka import Probe, Site, Candidate
>>> rng = np.random.default_rng(0)
>>> probe = Probe([Candidate("e4m3", "e4m3", "channel")], tau=0.1, p_max=0.05, delta=0.05)
>>> site = Site("fc", m=64, n=32, k=64)
>>> for _ in range(60):
...     probe.observe(site, rng.standard_normal((64, 64)), rng.standard_normal((32, 64)))
>>> probe.report("fc")["e4m3/e4m3:channel"]["safe"]
True
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .decision import Posterior
from .emulate import apply_follow, emulate_gemm
from .noise import Prediction, predict
from .sites import Candidate, Site, default_candidates
from .stats import SiteStats

__all__ = ["Measurement", "measure", "Probe"]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Measured error of one candidate on one batch, after the site's following operation."""

    rel_error: float
    p99_row_error: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def measure(site: Site, a, b, cand: Candidate, *, amax_a=None, amax_b=None) -> Measurement:
    """Run the emulated GEMM of ``cand`` and the float64 reference; compare after ``site.follow``."""
    a = np.asarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a, np.float64)
    b = np.asarray(b.get() if hasattr(b, "get") and not isinstance(b, np.ndarray) else b, np.float64)
    ref = apply_follow(a @ b.T, site.follow)
    got = apply_follow(emulate_gemm(a, b, cand, amax_a=amax_a, amax_b=amax_b), site.follow)
    d = got - ref
    if not np.isfinite(d).all():
        return Measurement(math.inf, math.inf)
    den = math.sqrt(float((ref * ref).sum()))
    rel = math.sqrt(float((d * d).sum())) / den if den > 0 else 0.0
    rn = np.sqrt((ref * ref).sum(axis=1))
    dn = np.sqrt((d * d).sum(axis=1))
    rows = np.where(rn > 0, dn / np.where(rn > 0, rn, 1.0), 0.0)
    return Measurement(rel, float(np.percentile(rows, 99)))


class _SiteState:
    def __init__(self, site, stats, posts):
        self.site = site
        self.stats = stats
        self.posteriors = posts
        self.predicted: dict[str, Prediction] = {}
        self.measured: dict[str, Measurement] = {}
        self.steps = 0
        self.measured_steps = 0


class Probe:
    """Watches sites, predicts and measures each candidate's error, keeps the posteriors.

    Parameters
    ----------
    candidates : list of Candidate
        Default: :func:`~fp8lab.loka.sites.default_candidates`.
    tau : float
        Budget on the relative (Frobenius) error after the following operation.
    tau_row : float, optional
        Budget on the p99 row error (default: no row budget).
    p_max, delta : float
        Safe iff P(exceedance rate > p_max) <= delta.
    forget : float
        Forgetting factor of the posteriors.
    prior_weight : float
        Pseudo-trials of the prior built from the noise model (0: uniform prior, evidence only).
    margin : float
        Delayed scaling multiplies the history amax by this.
    stats_kw : dict
        Passed to :class:`~fp8lab.loka.stats.SiteStats` (``history``, ``sample``, ``forget``).
    """

    def __init__(self, candidates=None, *, tau: float = 0.05, tau_row: float | None = None,
                 p_max: float = 0.01, delta: float = 0.05, forget: float = 0.999,
                 prior_weight: float = 0.0, margin: float = 1.0, stats_kw=None):
        self.candidates = list(candidates) if candidates is not None else default_candidates()
        if not self.candidates:
            raise ValueError("a probe needs at least one candidate")
        self.tau, self.tau_row = float(tau), tau_row
        self.p_max, self.delta, self.forget = p_max, delta, forget
        self.prior_weight, self.margin = prior_weight, margin
        self.stats_kw = dict(stats_kw or {})
        grans = tuple(dict.fromkeys(c.scaling for c in self.candidates if not c.is_high))
        self._grans = grans or ("tensor",)
        self.sites: dict[str, _SiteState] = {}

    # ------------------------------------------------------------------ observing
    def state(self, name: str) -> _SiteState:
        try:
            return self.sites[name]
        except KeyError:
            raise KeyError(f"unknown site {name!r}; known: {', '.join(self.sites) or '(none)'}") from None

    def _new_posterior(self):
        return Posterior(self.p_max, self.delta, self.forget)

    def update_stats(self, site: Site, a, b) -> _SiteState:
        """Statistics only (the every-step part): amax, histograms, moments."""
        st = self.sites.get(site.name)
        if st is None:
            st = _SiteState(site, SiteStats(self._grans, **self.stats_kw),
                            {c.label: self._new_posterior() for c in self.candidates})
            self.sites[site.name] = st
        st.stats.update(a, b)
        st.steps += 1
        return st

    def predict(self, name: str) -> dict[str, Prediction]:
        st = self.state(name)
        st.predicted = {c.label: predict(st.site, st.stats, c, margin=self.margin)
                        for c in self.candidates}
        return st.predicted

    def observe(self, site: Site, a, b, *, measure_now: bool = True) -> None:
        """Fold one batch in: statistics and predictions, and (``measure_now``) one measured trial
        per candidate."""
        st = self.update_stats(site, a, b)
        first = st.measured_steps == 0
        self.predict(site.name)
        if first and self.prior_weight > 0:
            for c in self.candidates:
                st.posteriors[c.label] = Posterior.from_prediction(
                    st.predicted[c.label].rel_error, self.tau, weight=self.prior_weight,
                    p_max=self.p_max, delta=self.delta, forget=self.forget)
        if measure_now:
            self.measure(site.name, a, b)

    def measure(self, name: str, a, b) -> dict[str, Measurement]:
        st = self.state(name)
        out = {}
        for c in self.candidates:
            kw = {}
            if c.delayed:
                kw = {"amax_a": st.stats.a.history_amax(self.margin),
                      "amax_b": st.stats.b.history_amax(self.margin)}
            m = measure(st.site, a, b, c, **kw)
            out[c.label] = m
            st.posteriors[c.label].observe(self.exceeds(m))
        st.measured = out
        st.measured_steps += 1
        return out

    def exceeds(self, m) -> bool:
        if not math.isfinite(m.rel_error) or m.rel_error > self.tau:
            return True
        return self.tau_row is not None and m.p99_row_error > self.tau_row

    def reset(self, name: str) -> None:
        """Forget the evidence of a site (its distribution changed)."""
        st = self.state(name)
        for p in st.posteriors.values():
            p.reset()

    # ------------------------------------------------------------------ reporting
    def report(self, name: str) -> dict:
        """Per candidate label: predicted, measured (last batch), posterior and Safe verdict."""
        st = self.state(name)
        out = {}
        for c in self.candidates:
            post = st.posteriors[c.label]
            pred = st.predicted.get(c.label)
            meas = st.measured.get(c.label)
            out[c.label] = {
                "predicted": pred.to_dict() if pred else None,
                "measured": meas.to_dict() if meas else None,
                # the model's own precision is the reference: Safe by definition
                "p_unsafe": 0.0 if c.is_high else post.p_unsafe,
                "trials": post.trials,
                "failures": post.fail,
                "safe": True if c.is_high else post.safe,
            }
        return out
