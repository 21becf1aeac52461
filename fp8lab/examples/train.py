"""The experiment: train the DLRM in float32, in naive FP8 and with LoKA, on paired seeds.

Three numerics, one model, the same initialization and batch order per seed:

``float32``
    Every GEMM a float32 numpy matmul.
``fp8``
    Naive FP8: every GEMM of every layer (first and logit layers included) quantizes both
    operands with per-tensor scaling (``amax / fmax``, just in time), e4m3 in the forward pass,
    e5m2 for the gradient operand and e4m3 for the other operand in the backward pass.
``loka``
    LoKA: for ``warmup`` steps every GEMM runs in bf16 while the Probe measures every candidate
    (e4m3, e5m2, hif8 x per-tensor, per-row scaling; bf16) on the real operands of every site;
    then Dispatch picks, per site, the fastest candidate that the Probe certifies Safe, after the
    Mods (precision gating of first / logit / tiny GEMMs, re-centering of the weight of a GEMM
    followed by LayerNorm). Every ``refresh`` steps all sites are measured again and re-chosen.

How an 8-bit GEMM is emulated: both operands go through :func:`fp8lab.quantize` (the exact codec;
saturating) and back with ``dequantize``, then a float32 matmul: the numerics of an FP8 GEMM
whose products are exact and whose accumulation is modelled as float32 (tensor-core FP8 GEMMs
accumulate in at least fp32; the model ignores their intermediate truncation). bf16 operands are
rounded to bf16 (nearest even) and multiplied in float32 likewise. Embedding tables, LayerNorm,
the element-wise parts of the cross layers, the optimizer and the loss run in float32 in every run.

Dispatch ranks options by time. On this CPU every emulated 8-bit GEMM is slower than float32, so
measured CPU times would keep every site in high precision; the experiment therefore gives the
Dispatcher a performance database filled from a roofline model of an H200 (bf16 989 TFLOP/s, FP8
1979 TFLOP/s, 4.8 TB/s; casts fused into the producing kernel; HiF8 decoded to fp16 in the kernel)
at each site's shape. These times are modelled, not measured: ``benchmarks/dlrm_step_gpu.py``
measures the real step on an H200.

Run ``python -m fp8lab.examples.train --help`` or ``fp8lab dlrm --help``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

from .data import ClickData, auc, logloss, make_click_data, normalized_entropy
from .dlrm import DLRM, DLRMConfig, GemmSpec, bce_with_logits

__all__ = ["Float32", "NaiveFP8", "Loka", "ExperimentConfig", "train_run", "run_experiment",
           "summarize", "quantize_dequantize", "round_bf16", "h200_model_kernels",
           "h200_model_time", "MODES"]

MODES = ("float32", "fp8", "loka")


# ---------------------------------------------------------------------- operand rounding
def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest-even bfloat16 -> float32 (finite inputs).

    bf16 keeps the top 16 bits of a float32::

        sign | exponent (8) | mantissa 7 kept | 16 dropped
        adding 0x7FFF + (bit 16) then truncating rounds to nearest, ties to even.
    """
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (r & np.uint32(0xFFFF0000)).view(np.float32)


_SCALINGS = {}


def _scaling(gran: str):
    from ..scaling import Scaling

    if gran not in _SCALINGS:
        # loka's "channel" is one scale per row of an operand (shared along K, the last axis)
        _SCALINGS[gran] = Scaling.parse("channel" if gran == "channel" else gran)
    return _SCALINGS[gran]


def quantize_dequantize(x: np.ndarray, fmt: str, gran: str = "tensor") -> np.ndarray:
    """``dequantize(quantize(x, fmt, scaling=gran, saturate=True))`` as float32 (the definition)."""
    from ..qtensor import quantize

    return quantize(np.ascontiguousarray(x), fmt, scaling=_scaling(gran),
                    saturate=True).dequantize(np.float32)


def fake_quantize(x: np.ndarray, fmt: str, gran: str = "tensor") -> np.ndarray:
    """The same values as :func:`quantize_dequantize` (tested equal, bit for bit), about 2.5x
    faster on the small operands of this model: the scale from :func:`fp8lab.scaling.compute_scale`
    and one call each of the exact codecs, without building a QTensor.

    ``gran``: ``tensor`` or ``channel`` (one scale per row); anything else takes the slow path.
    """
    from ..codecs import decode, encode
    from ..scaling import compute_scale

    x = np.ascontiguousarray(x, np.float32)
    if gran == "tensor":
        amax = np.abs(x).max(initial=0.0)
    elif gran == "channel":
        amax = np.abs(x).max(axis=1, keepdims=True, initial=0.0)
    else:
        return quantize_dequantize(x, fmt, gran)
    s = np.asarray(compute_scale(amax, fmt), np.float32)
    return decode(encode(x / s, fmt, saturate=True), fmt) * s


# ---------------------------------------------------------------------- numerics
class _Counting:
    """Counts GEMM flops per site while ``training`` is true, split 8-bit / high precision."""

    name = "?"

    def __init__(self):
        self.training = True
        self.flops = {}     # site name -> [8-bit flops, high flops]

    def _count(self, name: str, flops: int, eight: bool) -> None:
        if self.training:
            f = self.flops.setdefault(name, [0, 0])
            f[0 if eight else 1] += flops

    def count_high(self, name: str, flops: int) -> None:
        self._count(name, flops, False)

    def flop_share(self) -> float:
        e = sum(v[0] for v in self.flops.values())
        h = sum(v[1] for v in self.flops.values())
        return e / (e + h) if e + h else 0.0

    def end_step(self, step: int) -> None:
        pass


class Float32(_Counting):
    """Every GEMM a float32 matmul."""

    name = "float32"

    def gemm(self, spec: GemmSpec, a, b):
        self._count(spec.name, 2 * a.shape[0] * b.shape[0] * a.shape[1], False)
        return a @ b.T


class NaiveFP8(_Counting):
    """Every GEMM in 8 bits: e4m3 forward, e5m2 gradient operand, per-tensor scaling."""

    name = "fp8"

    def __init__(self, fwd="e4m3", grad="e5m2", other="e4m3", scaling="tensor"):
        super().__init__()
        self.fwd, self.grad, self.other, self.scaling = fwd, grad, other, scaling

    def gemm(self, spec: GemmSpec, a, b):
        self._count(spec.name, 2 * a.shape[0] * b.shape[0] * a.shape[1], True)
        fa, fb = (self.fwd, self.fwd) if spec.kind == "fwd" else (self.grad, self.other)
        return fake_quantize(a, fa, self.scaling) @ fake_quantize(b, fb, self.scaling).T


def run_candidate(cand, a, b) -> np.ndarray:
    """``A @ B.T`` with candidate ``cand``: bf16 operands for ``high``, else 8-bit operands."""
    if cand.is_high:
        return round_bf16(a) @ round_bf16(b).T
    return fake_quantize(a, cand.fmt_a, cand.scaling) @ fake_quantize(b, cand.fmt_b, cand.scaling).T


# ---------------------------------------------------------------------- modelled H200 kernels
H200 = {"bf16_flops": 989e12, "fp8_flops": 1979e12, "bytes_per_s": 4.8e12}
#: Relative cost of the scale epilogue per granularity (per-row scales: a vector multiply).
_SCALING_COST = {"tensor": 1.0, "channel": 1.03, "block:128": 1.10}


def h200_model_time(kernel: str, m: int, n: int, k: int) -> float:
    """Roofline seconds of one GEMM (m, n, k) on an H200 (a model, not a measurement).

    ``max(flops / peak, bytes / bandwidth)``; 8-bit kernels read 1-byte operands written by the
    producing kernel (fused cast) and write bf16; HiF8 is decoded to fp16 in the kernel, so it
    computes at the fp16 rate. Launch overhead is the same for every option and left out.
    """
    f = 2.0 * m * n * k
    if kernel == "h200-bf16":
        return max(f / H200["bf16_flops"], 2.0 * (m * k + n * k + m * n) / H200["bytes_per_s"])
    by = (m * k + n * k + 2.0 * m * n) / H200["bytes_per_s"]
    if kernel == "h200-hif8-f16":
        return 1.05 * max(f / H200["bf16_flops"], by)
    gran = kernel.split(":", 1)[1]
    return _SCALING_COST[gran] * max(f / H200["fp8_flops"], by)


def h200_model_kernels(scalings=("tensor", "channel")):
    """Kernel registry entries whose times come from :func:`h200_model_time`."""
    from ..loka.kernels import Kernel
    from ..loka.sites import HIGH

    ks = [Kernel("h200-bf16", "cpu", (HIGH,), None,
                 "modelled H200 bf16 GEMM (cuBLAS roofline)")]
    for g in scalings:
        ks.append(Kernel(f"h200-fp8:{g}", "cpu", ("e4m3", "e5m2"), (g,),
                         f"modelled H200 FP8 tensor-core GEMM, {g} scales, cast fused upstream",
                         fuses_cast=True))
    ks.append(Kernel("h200-hif8-f16", "cpu", ("hif8",), tuple(scalings),
                     "modelled H200 HiF8 decoded to fp16 in the kernel (no native HiF8 on Hopper)",
                     fuses_cast=True))
    return ks


MODEL_DEVICE = "h200-roofline-model"


class Loka(_Counting):
    """LoKA's numerics: Probe during ``warmup`` steps (bf16 meanwhile), then Dispatch per site.

    Parameters
    ----------
    warmup : int
        Steps of measurement before the first choice (>= the trials the posterior needs:
        58 at ``p_max = delta = 0.05``).
    refresh : int
        Re-measure every site and re-choose every ``refresh`` steps after warm-up (0: never).
    tau, tau_grad : float
        Error budgets (relative Frobenius error after the site's following op) of the forward
        sites and of the gradient sites (``dx``, ``dw``). Gradients get the looser budget: a
        minibatch gradient already differs from the full-batch one by far more than 10%.
    prior_weight : float
        Pseudo-trials of the Probe's prior built from the noise model's prediction; with 40 of
        them, ``warmup`` = 20 measured, failure-free batches certify a site (58 trials needed).
    probe_rows : int
        Rows of A the Probe measures per batch: the 8 of largest amax (so per-tensor scales are
        those of the whole batch and the worst rows are judged) and random others.
    recenter : bool
        Re-center the weight of every GEMM followed by LayerNorm (an exact re-parameterization).
    """

    name = "loka"

    def __init__(self, *, warmup: int = 20, refresh: int = 200, tau: float = 0.08,
                 tau_grad: float = 0.1, p_max: float = 0.05, delta: float = 0.05,
                 prior_weight: float = 40.0, formats=("e4m3", "hif8", "e5m2"),
                 scalings=("tensor", "channel"), recenter: bool = True, probe_rows: int = 64,
                 seed: int = 0):
        super().__init__()
        from ..loka import Candidate, Probe
        from ..loka.dispatch import Dispatcher
        from ..loka.perfdb import PerfDB
        from ..loka.sites import HIGH

        self.warmup, self.refresh, self.recenter = warmup, refresh, recenter
        self.high = Candidate(HIGH, HIGH)
        fwd = [self.high] + [Candidate(f, f, g) for f in formats for g in scalings]
        pairs = []
        for f in formats:  # gradient operand first; e5m2 gradients pair with e4m3 as usual
            pairs.append((f, "e4m3" if f == "e5m2" and "e4m3" in formats else f))
        bwd = [self.high] + [Candidate(fa, fb, g) for fa, fb in pairs for g in scalings]
        kw = dict(p_max=p_max, delta=delta, prior_weight=prior_weight,
                  stats_kw={"sample": 4096})
        self.probes = {"fwd": Probe(fwd, tau=tau, **kw), "bwd": Probe(bwd, tau=tau_grad, **kw)}
        self._rng = np.random.default_rng([seed, 2])
        self.perfdb = PerfDB(None)
        kernels = h200_model_kernels(scalings)
        self.dispatchers = {k: Dispatcher(p, self.perfdb, kernels, device=MODEL_DEVICE,
                                          autotime=False) for k, p in self.probes.items()}
        self.kernels = kernels
        self.choice: dict[str, object] = {}
        self.sites: dict[str, object] = {}
        self.observing = warmup > 0
        self.step_no = 0
        self.switches: list[tuple[int, str, str, str]] = []
        self.probe_rows = probe_rows
        self.step_flops: dict[str, int] = {}

    def _site(self, spec: GemmSpec, a, b):
        from ..loka import Site

        key = (spec.name, a.shape, b.shape)
        s = self.sites.get(key)
        if s is None:
            s = Site(spec.name, a.shape[0], b.shape[0], a.shape[1], follow=spec.follow,
                     roles=spec.roles, position=spec.position)
            self.sites[key] = s
        return s

    def _probe_sample(self, a):
        r = self.probe_rows
        if not r or a.shape[0] <= r:
            return a
        amax = np.abs(a).max(axis=1)
        top = np.argpartition(amax, -8)[-8:]
        rest = np.setdiff1d(np.arange(a.shape[0]), top)
        pick = np.concatenate([top, self._rng.choice(rest, r - 8, replace=False)])
        return a[np.sort(pick)]

    def gemm(self, spec: GemmSpec, a, b):
        if self.recenter and spec.kind == "fwd" and spec.follow == "layernorm":
            # LayerNorm over the outputs removes a per-row offset: W - mean over outputs gives
            # the same normalized result and a GEMM without the common offset
            b = b - b.mean(axis=0, keepdims=True)
        flops = 2 * a.shape[0] * b.shape[0] * a.shape[1]
        if self.training:
            self.step_flops[spec.name] = flops
        if self.observing and self.training:
            pa = self._probe_sample(a)
            site = self._site(spec, a, b)  # the site's real shape; the probe sees a row sample
            probe = self.probes["fwd" if spec.kind == "fwd" else "bwd"]
            probe.observe(site, pa, b)
        cand = self.choice.get(spec.name, self.high)
        self._count(spec.name, flops, not cand.is_high)
        return run_candidate(cand, a, b)

    def end_step(self, step: int) -> None:
        self.step_no = step + 1
        if self.observing and self.step_no >= self.warmup:
            self.dispatch(step)
        self.observing = (self.step_no < self.warmup
                          or (self.refresh > 0 and self.step_no % self.refresh == 0))

    def dispatch(self, step: int = -1) -> None:
        """Choose a candidate per site from the probes' evidence and the modelled kernel times."""
        from ..loka.sites import Candidate

        for kind, probe in self.probes.items():
            disp = self.dispatchers[kind]
            for name, st in probe.sites.items():
                s = st.site
                for k in self.kernels:
                    if self.perfdb.get(k.name, s.shape, MODEL_DEVICE) is None:
                        self.perfdb.put(k.name, s.shape, MODEL_DEVICE,
                                        h200_model_time(k.name, *s.shape))
                opt = disp.choose(name)
                new = Candidate.parse(opt.candidate)
                old = self.choice.get(name)
                if old is not None and old != new:
                    self.switches.append((step, name, old.label, new.label))
                self.choice[name] = new

    def safety_map(self) -> dict:
        """The dispatchers' safety maps, forward and backward sites together."""
        out = {}
        for disp in self.dispatchers.values():
            out.update(disp.safety_map())
        return out

    def kept_high(self) -> dict[str, str]:
        """Sites left in high precision (bf16), with the reason."""
        from ..loka.mods import gate

        out = {}
        for kind, probe in self.probes.items():
            for name, st in probe.sites.items():
                if name in self.choice and not self.choice[name].is_high:
                    continue
                why = gate(st.site)
                if why is None:
                    rep = probe.report(name)
                    best = min((c for c in probe.candidates if not c.is_high),
                               key=lambda c: rep[c.label]["p_unsafe"])
                    r = rep[best.label]
                    meas = (r["measured"] or {}).get("rel_error", math.nan)
                    why = (f"no 8-bit candidate certified Safe (best {best.label}: P(unsafe) = "
                           f"{r['p_unsafe']:.3g}, last measured error {meas:.3g} vs tau "
                           f"{probe.tau})")
                out[name] = why
        return out


# ---------------------------------------------------------------------- training
@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """Everything that defines one experiment (frozen)."""

    model: str = "small"
    seeds: tuple[int, ...] = (0, 1, 2)
    modes: tuple[str, ...] = MODES
    steps: int = 300
    batch: int = 256
    lr: float = 2e-3
    emb_lr: float = 0.05
    n_train: int = 160_000
    n_test: int = 40_000
    data_seed: int = 0
    warmup: int = 20
    refresh: int = 200
    tau: float = 0.08
    tau_grad: float = 0.1
    scalings: tuple[str, ...] = ("tensor", "channel")

    def __post_init__(self):
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"unknown mode {m!r}; known: {', '.join(MODES)}")
        if self.steps < 1 or self.batch < 1:
            raise ValueError("steps and batch must be >= 1")
        if not self.seeds:
            raise ValueError("at least one seed")
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "modes", tuple(self.modes))
        object.__setattr__(self, "scalings", tuple(self.scalings))


def make_numerics(mode: str, ec: ExperimentConfig):
    if mode == "float32":
        return Float32()
    if mode == "fp8":
        return NaiveFP8()
    if mode == "loka":
        return Loka(warmup=ec.warmup, refresh=ec.refresh, tau=ec.tau, tau_grad=ec.tau_grad,
                    scalings=ec.scalings)
    raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


class _Adam:
    def __init__(self, params: dict, lr: float, b1=0.9, b2=0.999, eps=1e-8):
        self.p, self.lr, self.b1, self.b2, self.eps = params, lr, b1, b2, eps
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: dict) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for k, g in grads.items():
            m, v = self.m[k], self.v[k]
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            self.p[k] -= (self.lr / c1) * m / (np.sqrt(v / c2) + self.eps)


class _RowAdagrad:
    """Row-wise Adagrad for embedding tables (one accumulator per row, as DLRM trainers use)."""

    def __init__(self, tables, lr: float, eps: float = 1e-8):
        self.tables, self.lr, self.eps = tables, lr, eps
        self.acc = [np.zeros(len(t), np.float32) for t in tables]

    def step(self, emb_grads) -> None:
        for t, acc, (ids, rows) in zip(self.tables, self.acc, emb_grads):
            u, inv = np.unique(ids, return_inverse=True)
            g = np.zeros((len(u), t.shape[1]), np.float32)
            np.add.at(g, inv, rows)
            acc[u] += (g * g).mean(axis=1)
            t[u] -= self.lr * g / (np.sqrt(acc[u])[:, None] + self.eps)


def _config_for(name: str) -> DLRMConfig:
    return DLRMConfig.named(name)


def train_run(mode: str, data: ClickData, ec: ExperimentConfig, seed: int, *,
              log=None, numerics=None) -> dict:
    """Train one model; returns its metrics, loss curve, FLOP accounting (and LoKA's evidence).

    ``numerics`` overrides the one ``mode`` and ``ec`` describe (tests use small settings)."""
    cfg = _config_for(ec.model)
    model = DLRM(cfg, seed=seed)
    num = numerics if numerics is not None else make_numerics(mode, ec)
    opt = _Adam(model.dense_params(), ec.lr)
    eopt = _RowAdagrad(model.tables, ec.emb_lr)
    rng = np.random.default_rng([seed, 1])
    n = len(data.train)
    order = rng.permutation(n)
    losses = []
    t0 = time.perf_counter()
    tr = data.train
    F1 = cfg.num_sparse + 1
    for step in range(ec.steps):
        lo = (step * ec.batch) % n
        if lo + ec.batch > n:
            order = rng.permutation(n)
            lo = 0
        idx = order[lo:lo + ec.batch]
        z = model.forward(tr.dense[idx], tr.sparse[idx], num)
        loss, dz = bce_with_logits(z, tr.labels[idx])
        grads, eg = model.backward(dz, num)
        if cfg.interaction == "dot":  # the batched dot products: forward and two backward GEMMs
            num.count_high("interaction", 3 * 2 * len(idx) * F1 * F1 * cfg.embed_dim)
        opt.step(grads)
        eopt.step(eg)
        num.end_step(step)
        losses.append(loss)
        if not math.isfinite(loss):
            break
        if log and (step + 1) % max(1, ec.steps // 5) == 0:
            log(f"  {mode:7} seed {seed}: step {step + 1}/{ec.steps} "
                f"loss {np.mean(losses[-50:]):.4f}")
    train_s = time.perf_counter() - t0
    num.training = False
    te = data.test
    p = model.predict_proba(te.dense, te.sparse, num)
    res = {"mode": mode, "seed": seed, "steps": len(losses), "train_seconds": train_s,
           "auc": auc(te.labels, p), "logloss": logloss(te.labels, p),
           "ne": normalized_entropy(te.labels, p, data.ctr), "losses": [float(x) for x in losses],
           "flop_share_8bit": num.flop_share(),
           "site_flops": {k: list(map(int, v)) for k, v in num.flops.items()}}
    if isinstance(num, Loka):
        res["choices"] = {k: c.label for k, c in num.choice.items()}
        res["kept_high"] = num.kept_high()
        res["switches"] = num.switches
        res["safety_map"] = _jsonable(num.safety_map())
        # the share once Dispatch has chosen: one step's GEMMs under the final choices
        per = num.step_flops
        e = sum(f for k, f in per.items() if not num.choice.get(k, num.high).is_high)
        h = sum(f for k, f in per.items() if num.choice.get(k, num.high).is_high)
        res["flop_share_8bit_after_dispatch"] = e / (e + h) if e + h else 0.0
    return res


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _threads_one() -> None:
    """One Numba thread: the codec calls are small and the cores shared; more threads contend."""
    try:
        import numba

        numba.set_num_threads(1)
    except Exception:  # noqa: BLE001 - any failure just leaves the default
        pass


def run_experiment(ec: ExperimentConfig, *, log=None) -> dict:
    """Every (seed, mode) run of ``ec`` and the summary: a JSON-ready dict."""
    _threads_one()
    cfg = _config_for(ec.model)
    t0 = time.perf_counter()
    data = make_click_data(cfg, n_train=ec.n_train, n_test=ec.n_test, seed=ec.data_seed)
    if log:
        log(f"data: {ec.n_train} train / {ec.n_test} test rows, click rate {data.ctr:.4f}, "
            f"teacher AUC {data.bayes['auc']:.4f}, logloss {data.bayes['logloss']:.4f} "
            f"({time.perf_counter() - t0:.1f} s)")
    runs = []
    for seed in ec.seeds:
        for mode in ec.modes:
            r = train_run(mode, data, ec, seed, log=log)
            runs.append(r)
            if log:
                log(f"{mode:7} seed {seed}: AUC {r['auc']:.4f} logloss {r['logloss']:.5f} "
                    f"NE {r['ne']:.4f} 8-bit flops {100 * r['flop_share_8bit']:.1f}% "
                    f"({r['train_seconds']:.0f} s)")
    out = {"config": dataclasses.asdict(ec), "model": dataclasses.asdict(cfg),
           "data": {"ctr": data.ctr, "bayes": {k: float(v) for k, v in data.bayes.items()},
                    "n_train": ec.n_train, "n_test": ec.n_test, "seed": ec.data_seed},
           "runs": _jsonable(runs), "seconds": time.perf_counter() - t0}
    out["summary"] = summarize(out)
    return out


def _ms(xs) -> dict:
    xs = np.asarray(xs, np.float64)
    return {"mean": float(xs.mean()), "std": float(xs.std(ddof=1)) if len(xs) > 1 else 0.0,
            "min": float(xs.min()), "max": float(xs.max()), "n": int(len(xs))}


def summarize(result: dict) -> dict:
    """Per mode: mean, sample std, min and max over seeds of each metric; the relative logloss
    against float32 of the same seed (paired); the 8-bit FLOP share; LoKA's high sites."""
    runs = result["runs"]
    by = {}
    for r in runs:
        by.setdefault(r["mode"], []).append(r)
    f32 = {r["seed"]: r for r in by.get("float32", [])}
    out = {}
    for mode, rs in by.items():
        s = {k: _ms([r[k] for r in rs]) for k in ("auc", "logloss", "ne", "flop_share_8bit",
                                                   "train_seconds")}
        paired = [(r["logloss"] - f32[r["seed"]]["logloss"]) / f32[r["seed"]]["logloss"]
                  for r in rs if r["seed"] in f32]
        if paired:
            s["rel_logloss_vs_float32"] = _ms(paired)
        if mode == "loka":
            s["flop_share_8bit_after_dispatch"] = _ms([r["flop_share_8bit_after_dispatch"]
                                                       for r in rs])
            kept = {}
            for r in rs:
                for site, why in r["kept_high"].items():
                    kept.setdefault(site, {"seeds": 0, "why": why})["seeds"] += 1
            s["kept_high"] = kept
        out[mode] = s
    if "loka" in out and "float32" in out:
        rel = out["loka"].get("rel_logloss_vs_float32", {}).get("mean", math.inf)
        share = out["loka"]["flop_share_8bit"]["mean"]
        out["goal"] = {"rel_logloss_within_0.1%": bool(rel <= 1e-3),
                       "loka_rel_logloss": rel, "flop_share_8bit": share,
                       "flop_share_at_least_70%": bool(share >= 0.70)}
    return out


# ---------------------------------------------------------------------- command line
def add_arguments(p) -> None:
    p.add_argument("--model", default="small",
                   help="model sizes: small (default), tiny, criteo-kaggle, mlperf-dcnv2")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma-separated runs (default {','.join(MODES)})")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate (dense parameters)")
    p.add_argument("--emb-lr", type=float, default=0.05, help="row-wise Adagrad rate (embeddings)")
    p.add_argument("--train-rows", type=int, default=160_000)
    p.add_argument("--test-rows", type=int, default=40_000)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=20, help="LoKA: probe steps before dispatch")
    p.add_argument("--refresh", type=int, default=200, help="LoKA: re-probe every N steps")
    p.add_argument("--budget", type=float, default=0.08,
                   help="LoKA: error budget tau of the forward GEMMs (default 0.08)")
    p.add_argument("--grad-budget", type=float, default=0.1,
                   help="LoKA: error budget of the gradient GEMMs (default 0.1)")
    p.add_argument("--scalings", default="tensor,channel",
                   help="LoKA: scaling granularities to consider (tensor, channel, block:128)")
    p.add_argument("--json", metavar="FILE", help="write every number as JSON to FILE")
    p.add_argument("--report", metavar="DIR",
                   help="write report.md and PNG figures (needs matplotlib) to DIR")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")


def config_from_args(args) -> ExperimentConfig:
    def ints(s):
        return tuple(int(x) for x in s.split(",") if x.strip())

    return ExperimentConfig(model=args.model, seeds=ints(args.seeds),
                            modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
                            steps=args.steps, batch=args.batch, lr=args.lr, emb_lr=args.emb_lr,
                            n_train=args.train_rows, n_test=args.test_rows,
                            data_seed=args.data_seed, warmup=args.warmup, refresh=args.refresh,
                            tau=args.budget, tau_grad=args.grad_budget,
                            scalings=tuple(s.strip() for s in args.scalings.split(",")))


def run_from_args(args, command: str = "python -m fp8lab.examples.train") -> int:
    """Run the experiment as the command line asked; the results table goes to stdout."""
    from .report import results_table, write_report

    ec = config_from_args(args)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    res = run_experiment(ec, log=None if args.quiet else log)
    res["command"] = command
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
    if args.report:
        os.makedirs(args.report, exist_ok=True)
        write_report(res, args.report)
    print(results_table(res))
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m fp8lab.examples.train",
                                description="Train the DLRM in float32, naive FP8 and with LoKA "
                                "on paired seeds; print AUC, logloss, NE and the 8-bit FLOP share.")
    add_arguments(p)
    args = p.parse_args(argv)
    cmd = "python -m fp8lab.examples.train " + " ".join(argv if argv is not None else sys.argv[1:])
    return run_from_args(args, cmd.strip())


if __name__ == "__main__":
    sys.exit(main())
