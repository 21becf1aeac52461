"""Synthetic click data labelled by a random teacher DLRM, so the best achievable quality is known.

- Dense features: Student-t with 3 degrees of freedom (heavy tails: a few values per batch are
  10-30x the typical magnitude, which is what breaks per-tensor 8-bit scaling of a first layer).
- Categorical ids: Zipf-distributed (exponent ``zipf_a``) per feature, folded into the table and
  permuted, so a few ids are hot and most are rare, as in click logs.
- Labels: ``y ~ Bernoulli(sigmoid(spread * z + bias))`` where ``z`` is the standardized logit of a
  random teacher DLRM (float64, exact GEMMs) and ``bias`` sets the click rate. The teacher's own
  probabilities are the Bayes-optimal predictor, so their AUC and logloss on the held-out split
  are the best any student can reach (:attr:`ClickData.bayes`).

Everything is a function of ``seed``: the same seed gives the same arrays, bit for bit.

>>> from fp8lab.examples.data import make_click_data
>>> d = make_click_data(n_train=1000, n_test=500, seed=0)
>>> d.train.dense.shape, d.train.sparse.shape, d.test.labels.shape
((1000, 13), (1000, 8), (500,))
>>> again = make_click_data(n_train=1000, n_test=500, seed=0)
>>> bool((again.train.labels == d.train.labels).all())
True
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .dlrm import DLRM, DLRMConfig, sigmoid

__all__ = ["Split", "ClickData", "make_click_data", "teacher_config", "logloss", "auc",
           "normalized_entropy"]


@dataclasses.dataclass(frozen=True)
class Split:
    dense: np.ndarray    # (N, num_dense) float32
    sparse: np.ndarray   # (N, F) int64
    labels: np.ndarray   # (N,) float32, 0 or 1
    p_true: np.ndarray   # (N,) float64, the teacher's click probability

    def __len__(self) -> int:
        return len(self.labels)


@dataclasses.dataclass(frozen=True)
class ClickData:
    train: Split
    test: Split
    seed: int
    ctr: float                      # click rate of the training split
    bayes: dict                     # AUC, logloss, NE of the teacher's probabilities on test


def teacher_config(student: DLRMConfig) -> DLRMConfig:
    """The teacher: same inputs as the student, a different (dot-interaction) architecture."""
    return DLRMConfig(num_dense=student.num_dense, vocab_sizes=student.vocab_sizes,
                      embed_dim=8, bottom=(32,), interaction="dot", top=(64,), layernorm=False)


def _features(rng, n, cfg: DLRMConfig, zipf_a: float, perms):
    dense = rng.standard_t(3.0, size=(n, cfg.num_dense)).astype(np.float32)
    sparse = np.empty((n, cfg.num_sparse), np.int64)
    for f, v in enumerate(cfg.vocab_sizes):
        ids = (rng.zipf(zipf_a, size=n) - 1) % v
        sparse[:, f] = perms[f][ids]
    return dense, sparse


def make_click_data(cfg: DLRMConfig | None = None, *, n_train: int = 160_000, n_test: int = 40_000,
                    seed: int = 0, zipf_a: float = 1.2, spread: float = 2.0,
                    ctr: float = 0.25) -> ClickData:
    """Generate the train and held-out splits for a student of sizes ``cfg`` (default: small).

    ``spread`` is the standard deviation of the teacher's logit (larger: easier task, higher
    best AUC); ``ctr`` the target click rate (sets the logit bias).
    """
    cfg = cfg or DLRMConfig.small()
    rng = np.random.default_rng([seed, 0x0C11C])
    perms = [rng.permutation(v) for v in cfg.vocab_sizes]
    teacher = DLRM(teacher_config(cfg), seed=int(rng.integers(2**31)), dtype=np.float64)
    for t in teacher.tables:  # larger embeddings than an initialization: ids matter
        t *= 2.0
    n = n_train + n_test
    dense, sparse = _features(rng, n, cfg, zipf_a, perms)
    # the teacher sees the dense features through a soft clip, as a feature transform would
    x = np.arcsinh(dense.astype(np.float64))
    z = teacher.predict_proba(x, sparse, chunk=8192)
    z = np.log(z) - np.log1p(-z)
    z = (z - z.mean()) / max(z.std(), 1e-12)
    # bias so that the mean of sigmoid(spread * z + bias) is ctr (bisection)
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if sigmoid(spread * z + mid).mean() < ctr:
            lo = mid
        else:
            hi = mid
    p = sigmoid(spread * z + 0.5 * (lo + hi))
    y = (rng.random(n) < p).astype(np.float32)
    tr, te = slice(0, n_train), slice(n_train, n)
    train = Split(dense[tr], sparse[tr], y[tr], p[tr])
    test = Split(dense[te], sparse[te], y[te], p[te])
    c = float(train.labels.mean())
    bayes = {"auc": auc(test.labels, test.p_true), "logloss": logloss(test.labels, test.p_true)}
    bayes["ne"] = normalized_entropy(test.labels, test.p_true, c)
    return ClickData(train, test, seed, c, bayes)


# ---------------------------------------------------------------------- metrics
def logloss(y, p, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``p`` (clipped to [eps, 1 - eps])."""
    p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
    y = np.asarray(y, np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


def normalized_entropy(y, p, ctr: float) -> float:
    """Logloss divided by the entropy of the background click rate ``ctr`` (He et al. 2014)."""
    h = -(ctr * np.log(ctr) + (1 - ctr) * np.log1p(-ctr))
    return logloss(y, p) / h


def auc(y, score) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties)."""
    from scipy.stats import rankdata

    y = np.asarray(y) > 0.5
    n1 = int(y.sum())
    n0 = len(y) - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    r = rankdata(np.asarray(score, np.float64))
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
