"""Synthetic operand suites for the LoKA evidence (prediction accuracy, calibration).

>>> from fp8lab.loka.suite import make_operands
>>> make_operands("laplace", 8, 4, 16, seed=0)[0].shape
(8, 16)
"""

from __future__ import annotations

import numpy as np

__all__ = ["DISTRIBUTIONS", "make_operands"]

DISTRIBUTIONS = ("gaussian", "laplace", "lognormal", "outlier_channels")


def make_operands(dist: str, m: int, n: int, k: int, *, seed: int = 0):
    """(A, B): A (m x k) drawn from ``dist``, B (n x k) Gaussian weights of scale 1/sqrt(k).

    ``outlier_channels``: Gaussian A whose 2 % of columns (input features) are 50 x larger, the
    pattern of LLM/recommender activations.
    """
    rng = np.random.default_rng(seed)
    if dist == "gaussian":
        a = rng.standard_normal((m, k))
    elif dist == "laplace":
        a = rng.laplace(size=(m, k))
    elif dist == "lognormal":
        a = rng.lognormal(0.0, 1.0, (m, k)) * rng.choice([-1.0, 1.0], (m, k))
    elif dist == "outlier_channels":
        a = rng.standard_normal((m, k))
        cols = rng.choice(k, max(1, k // 50), replace=False)
        a[:, cols] *= 50.0
    else:
        raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
    b = rng.standard_normal((n, k)) / np.sqrt(k)
    return a, b
