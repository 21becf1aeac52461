"""The statistical decision: a Beta-Binomial posterior on budget exceedances, with forgetting.

Each measured batch of a (site, candidate) is a Bernoulli trial: did its error exceed the budget
``tau``? With a uniform Beta(1, 1) prior and (decayed) counts ``f`` failures and ``s`` successes the
posterior of the exceedance rate is Beta(1 + f, 1 + s); the candidate is **Safe** iff
``P(rate > p_max) <= delta``. With zero failures that needs ``s >= log(delta) / log(1 - p_max) - 1``
trials: 298 at p_max = 1 %, delta = 5 %; 58 at p_max = 5 %. Forgetting multiplies both counts by
``forget`` before each trial, so old evidence fades (the effective sample size is bounded by
``1 / (1 - forget)``, which must exceed the trials needed to certify).

An optional prior from the noise model adds ``prior_weight`` pseudo-trials whose exceedance rate is
``P(prediction * exp(N(0, sigma)) > tau)`` (a log-normal error model of the prediction).

>>> from fp8lab.loka.decision import Posterior
>>> p = Posterior(p_max=0.05, delta=0.05, forget=1.0)
>>> for _ in range(57): p.observe(False)
>>> p.safe
False
>>> p.observe(False); p.safe
True
>>> p.trials_to_certify(0.05, 0.05), p.trials_to_certify(0.01, 0.05)
(58, 298)
"""

from __future__ import annotations

import math

from scipy import special, stats

__all__ = ["Posterior"]


class Posterior:
    """Beta-Binomial posterior on the exceedance rate of one (site, candidate)."""

    def __init__(self, p_max: float = 0.01, delta: float = 0.05, forget: float = 0.999,
                 prior_fail: float = 0.0, prior_ok: float = 0.0):
        if not 0 < p_max < 1 or not 0 < delta < 1:
            raise ValueError("p_max and delta must lie in (0, 1)")
        if not 0 < forget <= 1:
            raise ValueError("forget must lie in (0, 1]")
        self.p_max, self.delta, self.forget = p_max, delta, forget
        self.fail = float(prior_fail)
        self.ok = float(prior_ok)
        self.trials = 0

    @classmethod
    def from_prediction(cls, predicted: float, tau: float, *, sigma: float = 0.25,
                        weight: float = 0.0, **kw) -> "Posterior":
        """A posterior whose prior holds ``weight`` pseudo-trials drawn from the prediction."""
        if predicted <= 0:
            pe = 0.0
        elif not math.isfinite(predicted):
            pe = 1.0
        else:
            pe = float(stats.norm.sf(math.log(tau / predicted) / sigma))
        return cls(prior_fail=weight * pe, prior_ok=weight * (1 - pe), **kw)

    def observe(self, exceeded: bool) -> None:
        self.fail *= self.forget
        self.ok *= self.forget
        if exceeded:
            self.fail += 1.0
        else:
            self.ok += 1.0
        self.trials += 1

    def reset(self) -> None:
        """Forget all evidence (after a distribution jump)."""
        self.fail = self.ok = 0.0
        self.trials = 0

    @property
    def p_unsafe(self) -> float:
        """Posterior P(rate > p_max)."""
        return float(special.betaincc(1.0 + self.fail, 1.0 + self.ok, self.p_max))

    @property
    def safe(self) -> bool:
        return self.p_unsafe <= self.delta

    @property
    def mean_rate(self) -> float:
        return (1.0 + self.fail) / (2.0 + self.fail + self.ok)

    @staticmethod
    def trials_to_certify(p_max: float, delta: float) -> int:
        """Failure-free trials a uniform prior needs before Safe."""
        return max(0, math.ceil(math.log(delta) / math.log1p(-p_max) - 1 - 1e-12))

    def to_dict(self) -> dict:
        return {"fail": self.fail, "ok": self.ok, "trials": self.trials,
                "p_unsafe": self.p_unsafe, "safe": self.safe}
