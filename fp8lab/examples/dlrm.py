"""A DLRM / DCNv2-style recommendation model in numpy, forward and backward.

Architecture (Naumov et al. 2019; Wang et al. 2021 for the cross network)::

    dense (B, num_dense) -> bottom MLP (Linear -> ReLU)* -> (B, D)  ---+
    sparse ids (B, F)    -> F embedding tables            -> (B, F, D) -+-> interaction
    interaction "dot": [bottom output, upper triangle of the (F+1) x (F+1) dot products]
    interaction "dcn": x0 = concat of the F+1 vectors; x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l
    -> top MLP (Linear -> LayerNorm -> ReLU)* -> Linear -> logit

LayerNorm follows every hidden GEMM of the top MLP: that is where a LayerNorm after a GEMM amplifies
the GEMM's error (``docs/loka.md``), and where LoKA's re-centering mod applies.

Every GEMM of training goes through a *numerics* object as ``C = A @ B.T`` with a named site:
``<layer>.fwd`` (A: activations, B: weight), ``<layer>.dx`` (A: output gradient, B: weight
transposed) and ``<layer>.dw`` (A: output gradient transposed, B: input activations transposed),
so one model runs in float32, in emulated FP8 or with LoKA's per-site choices
(:mod:`fp8lab.examples.train`). The dot products of the interaction are a batched GEMM kept in the
model's precision in every run.

>>> import numpy as np
>>> from fp8lab.examples.dlrm import DLRM, DLRMConfig
>>> cfg = DLRMConfig.tiny()
>>> model = DLRM(cfg, seed=0)
>>> rng = np.random.default_rng(0)
>>> dense = rng.standard_normal((4, cfg.num_dense)).astype(np.float32)
>>> sparse = rng.integers(0, 5, (4, len(cfg.vocab_sizes)))
>>> model.forward(dense, sparse).shape
(4,)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["DLRMConfig", "DLRM", "GemmSpec", "Exact", "sigmoid", "bce_with_logits"]


@dataclasses.dataclass(frozen=True)
class DLRMConfig:
    """Sizes of a DLRM / DCNv2 model (frozen, validated).

    Parameters
    ----------
    num_dense : int
        Dense (continuous) input features.
    vocab_sizes : tuple of int
        Rows of each embedding table (one table per categorical feature).
    embed_dim : int
        Embedding dimension D; the bottom MLP ends at D too.
    bottom : tuple of int
        Hidden widths of the bottom MLP (its last layer maps to ``embed_dim``).
    interaction : {"dot", "dcn"}
    cross_layers, cross_rank : int
        DCNv2 cross layers and the rank of their low-rank weights ``U V``.
    top : tuple of int
        Hidden widths of the top MLP (each followed by LayerNorm if ``layernorm``, then ReLU);
        a last Linear maps to one logit.
    layernorm : bool
    """

    num_dense: int = 13
    vocab_sizes: tuple[int, ...] = (2000,) * 8
    embed_dim: int = 16
    bottom: tuple[int, ...] = (128, 64)
    interaction: str = "dcn"
    cross_layers: int = 2
    cross_rank: int = 32
    top: tuple[int, ...] = (256, 128)
    layernorm: bool = True

    def __post_init__(self):
        object.__setattr__(self, "vocab_sizes", tuple(int(v) for v in self.vocab_sizes))
        object.__setattr__(self, "bottom", tuple(int(v) for v in self.bottom))
        object.__setattr__(self, "top", tuple(int(v) for v in self.top))
        if self.interaction not in ("dot", "dcn"):
            raise ValueError(f"unknown interaction {self.interaction!r}; known: dot, dcn")
        for name in ("num_dense", "embed_dim", "cross_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cross_layers < 0:
            raise ValueError("cross_layers must be >= 0")
        if not self.vocab_sizes or min(self.vocab_sizes) < 1:
            raise ValueError("vocab_sizes needs at least one table, each with >= 1 row")
        if any(w < 1 for w in self.bottom + self.top):
            raise ValueError("MLP widths must be >= 1")

    @property
    def num_sparse(self) -> int:
        return len(self.vocab_sizes)

    @property
    def interaction_width(self) -> int:
        """Width of the top MLP's input."""
        f = self.num_sparse + 1
        if self.interaction == "dot":
            return self.embed_dim + f * (f - 1) // 2
        return f * self.embed_dim

    @classmethod
    def small(cls) -> "DLRMConfig":
        """The default: trains in about a minute per run on two CPU cores."""
        return cls()

    @classmethod
    def tiny(cls) -> "DLRMConfig":
        """For tests and gradient checks."""
        return cls(num_dense=3, vocab_sizes=(5, 7), embed_dim=4, bottom=(6,), interaction="dcn",
                   cross_layers=1, cross_rank=3, top=(8, 5))

    @classmethod
    def mini(cls) -> "DLRMConfig":
        """For quick training tests: every inner GEMM is just large enough not to be gated."""
        return cls(num_dense=13, vocab_sizes=(50,) * 4, embed_dim=16, bottom=(64,),
                   interaction="dcn", cross_layers=1, cross_rank=16, top=(64,))

    @classmethod
    def mlperf_dcnv2(cls, vocab_rows: int = 10000) -> "DLRMConfig":
        """MLPerf DLRM-DCNv2 sizes: 13 dense, 26 tables of dim 128, bottom 13-512-256-128,
        3 cross layers of rank 512 (width 27 x 128 = 3456), top 1024-1024-512-256-1.
        (MLPerf's tables hold up to 40M rows; ``vocab_rows`` caps them for synthetic data.)"""
        return cls(num_dense=13, vocab_sizes=(vocab_rows,) * 26, embed_dim=128, bottom=(512, 256),
                   interaction="dcn", cross_layers=3, cross_rank=512, top=(1024, 1024, 512, 256))

    @classmethod
    def criteo_kaggle(cls, vocab_rows: int = 10000) -> "DLRMConfig":
        """DLRM (Criteo Kaggle): dim 16, bottom 13-512-256-64-16, dot interaction, top 512-256-1."""
        return cls(num_dense=13, vocab_sizes=(vocab_rows,) * 26, embed_dim=16,
                   bottom=(512, 256, 64), interaction="dot", top=(512, 256), layernorm=False)

    @classmethod
    def named(cls, name: str) -> "DLRMConfig":
        known = {"small": cls.small, "tiny": cls.tiny, "mini": cls.mini,
                 "mlperf-dcnv2": cls.mlperf_dcnv2,
                 "criteo-kaggle": cls.criteo_kaggle}
        try:
            return known[name]()
        except KeyError:
            raise ValueError(f"unknown model size {name!r}; known: {', '.join(known)}") from None


@dataclasses.dataclass(frozen=True)
class GemmSpec:
    """The static part of a GEMM site ``C = A @ B.T``: what the numerics needs besides shapes.

    ``kind``: ``fwd``, ``dx`` or ``dw``; ``follow``: the op after the GEMM (``none``, ``relu``,
    ``layernorm``); ``position``: ``first`` / ``logit`` / ``inner``; ``roles``: of A and B.
    """

    name: str
    layer: str
    kind: str
    follow: str
    position: str
    roles: tuple[str, str]


class Exact:
    """Numerics that computes every GEMM in the operands' own dtype (float32 or float64)."""

    name = "exact"

    def gemm(self, spec: GemmSpec, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a @ b.T


def sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def bce_with_logits(z, y):
    """Mean binary cross-entropy of logits ``z`` against labels ``y`` and its gradient."""
    loss = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    return float(loss.mean()), ((sigmoid(z) - y) / z.shape[0]).astype(z.dtype)


class _Linear:
    """``y = x @ W.T + b`` with its three GEMM sites."""

    def __init__(self, name, n_in, n_out, rng, dtype, *, bias=True, follow="none",
                 position="inner", std=None):
        self.name = name
        std = math.sqrt(2.0 / n_in) if std is None else std
        self.W = (rng.standard_normal((n_out, n_in)) * std).astype(dtype)
        self.b = np.zeros(n_out, dtype) if bias else None
        self.fwd = GemmSpec(f"{name}.fwd", name, "fwd", follow, position, ("activation", "weight"))
        self.dx = GemmSpec(f"{name}.dx", name, "dx", "none", position, ("grad", "weight"))
        self.dw = GemmSpec(f"{name}.dw", name, "dw", "none", position, ("grad", "activation"))

    def params(self):
        out = {f"{self.name}.W": self.W}
        if self.b is not None:
            out[f"{self.name}.b"] = self.b
        return out

    def forward(self, x, num):
        self.x = x
        y = num.gemm(self.fwd, x, self.W)
        return y + self.b if self.b is not None else y

    def backward(self, dy, num, grads, need_dx=True):
        grads[f"{self.name}.W"] = num.gemm(self.dw, np.ascontiguousarray(dy.T),
                                           np.ascontiguousarray(self.x.T))
        if self.b is not None:
            grads[f"{self.name}.b"] = dy.sum(axis=0)
        if need_dx:
            return num.gemm(self.dx, dy, np.ascontiguousarray(self.W.T))
        return None


class _LayerNorm:
    def __init__(self, name, n, dtype, eps=1e-5):
        self.name, self.eps = name, eps
        self.g = np.ones(n, dtype)
        self.b = np.zeros(n, dtype)

    def params(self):
        return {f"{self.name}.g": self.g, f"{self.name}.b": self.b}

    def forward(self, x):
        mu = x.mean(axis=1, keepdims=True)
        d = x - mu
        self.rstd = 1.0 / np.sqrt((d * d).mean(axis=1, keepdims=True) + self.eps)
        self.xhat = d * self.rstd
        return self.xhat * self.g + self.b

    def backward(self, dy, grads):
        grads[f"{self.name}.g"] = (dy * self.xhat).sum(axis=0)
        grads[f"{self.name}.b"] = dy.sum(axis=0)
        dxh = dy * self.g
        return self.rstd * (dxh - dxh.mean(axis=1, keepdims=True)
                            - self.xhat * (dxh * self.xhat).mean(axis=1, keepdims=True))


class DLRM:
    """The model: parameters, ``forward`` (logits) and ``backward`` (gradients).

    Parameters
    ----------
    cfg : DLRMConfig
    seed : int
        Initialization seed.
    dtype : numpy dtype
        float32 for training, float64 for gradient checks.
    """

    def __init__(self, cfg: DLRMConfig, seed: int = 0, dtype=np.float32):
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        rng = np.random.default_rng(seed)
        D = cfg.embed_dim
        self.tables = [(rng.standard_normal((v, D)) * (1.0 / math.sqrt(D))).astype(dtype)
                       for v in cfg.vocab_sizes]
        self.bottom = []
        n_in = cfg.num_dense
        for i, w in enumerate(cfg.bottom + (D,)):
            self.bottom.append(_Linear(f"bottom.{i}", n_in, w, rng, dtype, follow="relu",
                                       position="first" if i == 0 else "inner"))
            n_in = w
        W0 = (cfg.num_sparse + 1) * D
        self.cross = []
        if cfg.interaction == "dcn":
            for i in range(cfg.cross_layers):
                v = _Linear(f"cross.{i}.v", W0, cfg.cross_rank, rng, dtype, bias=False,
                            std=1.0 / math.sqrt(W0))
                u = _Linear(f"cross.{i}.u", cfg.cross_rank, W0, rng, dtype,
                            std=0.5 / math.sqrt(cfg.cross_rank))
                self.cross.append((v, u))
        self.top, self.norms = [], []
        n_in = cfg.interaction_width
        for i, w in enumerate(cfg.top):
            self.top.append(_Linear(f"top.{i}", n_in, w, rng, dtype,
                                    follow="layernorm" if cfg.layernorm else "relu"))
            self.norms.append(_LayerNorm(f"top.{i}.ln", w, dtype) if cfg.layernorm else None)
            n_in = w
        self.top.append(_Linear(f"top.{len(cfg.top)}", n_in, 1, rng, dtype, position="logit",
                                std=1.0 / math.sqrt(n_in)))
        self.numerics = Exact()

    # ------------------------------------------------------------------ parameters
    def linears(self):
        out = list(self.bottom)
        for v, u in self.cross:
            out += [v, u]
        return out + list(self.top)

    def dense_params(self) -> dict[str, np.ndarray]:
        """Every parameter except the embedding tables, by name (the arrays themselves)."""
        out = {}
        for lin in self.linears():
            out.update(lin.params())
        for ln in self.norms:
            if ln is not None:
                out.update(ln.params())
        return out

    def gemm_specs(self) -> list[GemmSpec]:
        """Every GEMM site of one training step, in execution order of the forward pass."""
        out = []
        for lin in self.linears():
            out += [lin.fwd, lin.dw] + ([] if lin.fwd.position == "first" else [lin.dx])
        return out

    # ------------------------------------------------------------------ forward / backward
    def forward(self, dense, sparse, numerics=None) -> np.ndarray:
        """Logits, shape (B,). ``numerics`` (default: exact) computes every GEMM."""
        num = numerics or self.numerics
        self._num = num
        cfg = self.cfg
        h = np.asarray(dense, self.dtype)
        self._relu_bottom = []
        for lin in self.bottom:
            h = lin.forward(h, num)
            mask = h > 0
            self._relu_bottom.append(mask)
            h = h * mask
        self._sparse = np.asarray(sparse)
        emb = [t[self._sparse[:, f]] for f, t in enumerate(self.tables)]
        T = np.stack([h] + emb, axis=1)  # (B, F+1, D)
        self._T = T
        B = T.shape[0]
        if cfg.interaction == "dot":
            Z = T @ T.transpose(0, 2, 1)
            iu = np.triu_indices(T.shape[1], k=1)
            self._iu = iu
            x = np.concatenate([h, Z[:, iu[0], iu[1]]], axis=1)
        else:
            x0 = T.reshape(B, -1)
            x = x0
            self._cross_cache = []
            for v, u in self.cross:
                g = u.forward(v.forward(x, num), num)
                self._cross_cache.append((x, g))
                x = x0 * g + x
            self._x0 = x0
        for lin, ln in zip(self.top[:-1], self.norms):
            x = lin.forward(x, num)
            if ln is not None:
                x = ln.forward(x)
            mask = x > 0
            lin._mask = mask
            x = x * mask
        return self.top[-1].forward(x, num)[:, 0]

    def backward(self, dlogits, numerics=None):
        """Gradients of the loss whose gradient w.r.t. the logits is ``dlogits`` (B,).

        Returns ``(grads, emb_grads)``: ``grads`` maps dense parameter names to arrays;
        ``emb_grads`` is one ``(ids, rows)`` pair per table (rows: gradient per occurrence).
        """
        num = numerics or self._num
        cfg = self.cfg
        grads: dict[str, np.ndarray] = {}
        dx = self.top[-1].backward(np.asarray(dlogits, self.dtype)[:, None], num, grads)
        for lin, ln in zip(reversed(self.top[:-1]), reversed(self.norms)):
            dx = dx * lin._mask
            if ln is not None:
                dx = ln.backward(dx, grads)
            dx = lin.backward(dx, num, grads)
        T = self._T
        B, F1, D = T.shape
        if cfg.interaction == "dot":
            dh = dx[:, :D].copy()
            dZ = np.zeros((B, F1, F1), self.dtype)
            dZ[:, self._iu[0], self._iu[1]] = dx[:, D:]
            dT = (dZ + dZ.transpose(0, 2, 1)) @ T
            dT[:, 0, :] += dh
        else:
            dx0 = np.zeros_like(self._x0)
            for (v, u), (x_in, g) in zip(reversed(self.cross), reversed(self._cross_cache)):
                dx0 += dx * g
                dg = dx * self._x0
                dxl = v.backward(u.backward(dg, num, grads), num, grads)
                dx = dx + dxl
            dT = (dx0 + dx).reshape(B, F1, D)
        emb_grads = [(self._sparse[:, f], dT[:, f + 1, :]) for f in range(cfg.num_sparse)]
        dh = dT[:, 0, :]
        for lin, mask in zip(reversed(self.bottom), reversed(self._relu_bottom)):
            dh = dh * mask
            dh = lin.backward(dh, num, grads, need_dx=lin.fwd.position != "first")
        return grads, emb_grads

    def predict_proba(self, dense, sparse, numerics=None, chunk: int = 4096) -> np.ndarray:
        """Click probabilities, in chunks of ``chunk`` rows (forward GEMMs only)."""
        out = [sigmoid(self.forward(dense[i:i + chunk], sparse[i:i + chunk], numerics))
               for i in range(0, len(dense), chunk)]
        return np.concatenate(out) if out else np.zeros(0, self.dtype)

    def flops_per_sample(self) -> dict[str, int]:
        """Forward GEMM flops per sample, per layer (training adds dx and dw: about 3x)."""
        return {lin.name: 2 * lin.W.shape[0] * lin.W.shape[1] for lin in self.linears()}


def dense_embedding_grad(model: DLRM, emb_grads) -> list[np.ndarray]:
    """Embedding gradients as full tables (tests and small models only)."""
    out = []
    for t, (ids, rows) in zip(model.tables, emb_grads):
        g = np.zeros_like(t)
        np.add.at(g, ids, rows)
        out.append(g)
    return out
