"""Error of the quantized collectives against a float64 sum: predicted bound, statistical
prediction, measurement, and bytes on the wire.

Both predictions walk the same step list as the emulation, carrying for every rank and element the
exact partial sum ``S`` (float64, from the inputs alone) instead of the computed value:

* :func:`predict` ``.bound`` is rigorous: ``B`` bounds ``|computed - S|`` and grows at each event.
  Quantizing a computed partial ``v`` (``|v - S| <= B``) in a block whose scale lies in
  ``[s_lo, s_hi]`` (from the block maxima of ``|S| -+ B``) errs by at most::

      f * ur(t) * |v| + f * eta * s_hi + 2^-23 * |v| + 2^-149 * s_hi      (t = v / s)

  where ``ur(t) = 2^-(m+1)`` is the relative half-step of the format's binade of ``t`` (``m``
  mantissa bits there; the largest over the binades ``t`` may lie in), ``eta`` half the smallest
  step (the absolute error floor of the format's subnormal range), ``f = 1`` for nearest modes and
  2 for stochastic and toward-zero rounding (a full step), and the last two terms the float32
  division, multiply and underflow. A float32 add of partials adds ``2^-24 * |sum|``.
* :func:`predict` ``.rms`` is the statistical model for random data: each quantization event adds
  an independent error of variance ``(step(t) * s)^2 / 12`` (nearest) or ``/ 6`` (stochastic:
  the mean of ``f (1 - f) step^2`` over a uniform fraction ``f``), with ``t`` and ``s`` those of
  the exact partial. For ``h`` hops of similar magnitude this is ``sqrt(h) * step * s / sqrt(12)``.

>>> import numpy as np
>>> from fp8lab.collectives import Compression
>>> xs = np.random.default_rng(1).standard_normal((4, 4096)).astype(np.float32)
>>> m = measure(xs, Compression("e4m3", block=128))
>>> bool(m["max_err_over_bound"] <= 1.0), 0.7 < m["rms_measured"] / m["rms_predicted"] < 1.3
(True, True)
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .emulate import as_rank_inputs, run
from .schedule import build_schedule, chunk_bounds
from .wire import Compression

__all__ = ["format_constants", "predict", "Prediction", "measure", "wire_bytes", "error_table",
           "first_order_bound"]

_E32 = 2.0 ** -24


@functools.lru_cache(maxsize=None)
def format_constants(fmt: str) -> dict:
    """Grid facts of a format used by the predictions.

    ``u``: the largest relative half-step ``2^-(m+1)`` over binades whose step exceeds the smallest
    one (the unit roundoff of nearest rounding); ``eta``: half the smallest step; ``e_low``,
    ``mbits`` (per binade from ``e_low``), ``max``.

    >>> c = format_constants("e4m3"); c["u"], c["eta"] == 2.0**-10, c["max"]
    (0.0625, True, 448.0)
    """
    from ..formats import get_format

    f = get_format(fmt)
    b = f.binades
    e = np.arange(b.e_low, b.e_max + 1)
    m = np.asarray(b.mbits, dtype=np.int64)
    step = np.ldexp(1.0, e - m)
    delta = step[0]
    if np.any(np.diff(step) < 0):
        raise ValueError(f"{f.name}: grid step decreases with magnitude; the bounds assume it does not")
    ur = np.where(step > delta, np.ldexp(1.0, -(m + 1)), 0.0)
    return {"u": float(ur.max()), "eta": float(delta / 2), "e_low": int(b.e_low), "ur": ur,
            "step": step, "max": float(f.finfo.max), "target": float(f.finfo.scale_target)}


def _binade_index(t, c):
    """Index (from e_low) of the binade of t > 0, clipped to the grid; -1 below it."""
    _, k = np.frexp(t)
    e = k.astype(np.int64) - 1
    idx = np.clip(e - c["e_low"], 0, len(c["step"]) - 1)
    return np.where(t < np.ldexp(1.0, c["e_low"]), -1, idx)


def _blockmax(a, block):
    nb = -(-a.size // block)
    pad = np.zeros(nb * block, np.float64)
    pad[:a.size] = a
    return pad.reshape(nb, block).max(axis=1)


def _expand(v, size, block):
    return np.repeat(v, block)[:size]


def _event(S, B, comp: Compression):
    """(error bound, model variance) of quantizing one chunk with exact partial S, bound B."""
    c = format_constants(comp.fmt)
    M, blk = c["target"], comp.block  # the value a block's amax maps to
    if S.size == 0:
        return np.zeros(0), np.zeros(0)
    aS = np.abs(S)
    A_hi = _expand(_blockmax(aS + B, blk), S.size, blk)
    A_lo = _expand(_blockmax(np.maximum(aS - B, 0.0), blk), S.size, blk)
    A = _expand(_blockmax(aS, blk), S.size, blk)
    if comp.pow2:
        s_lo, s_hi = A_lo / M, 2.0 * A_hi / M
        with np.errstate(divide="ignore"):
            s_mod = np.where(A > 0, np.ldexp(1.0, np.ceil(np.log2(np.where(A > 0, A, 1) / M)).astype(int)), 1.0)
    else:
        s_lo, s_hi = A_lo / M * (1 - _E32), A_hi / M * (1 + _E32)
        s_mod = np.where(A > 0, A / M, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_lo = np.where(s_hi > 0, np.maximum(aS - B, 0.0) / s_hi * (1 - _E32), 0.0)
        t_hi = np.where(s_lo > 0, np.minimum((aS + B) / s_lo * (1 + _E32), M), M)
    t_hi = np.minimum(t_hi, M)
    i_lo, i_hi = _binade_index(t_lo, c), _binade_index(np.maximum(t_hi, 1e-300), c)
    ur = np.zeros(S.size)
    for j, u in enumerate(c["ur"]):
        if u:
            ur = np.maximum(ur, np.where((i_lo <= j) & (j <= i_hi), u, 0.0))
    f = 1.0 if comp.rounding in ("nearest_even", "nearest_away") else 2.0
    v = aS + B
    err = (1 + _E32) * (f * ur * (1 + _E32) * v + f * c["eta"] * s_hi) + 2.0 ** -23 * v \
        + 2.0 ** -149 * s_hi
    err = np.where(A_hi > 0, err, 0.0)  # an all-zero block is sent exactly
    # statistical model, on the exact partial
    t = aS / s_mod
    idx = _binade_index(np.maximum(t, 1e-300), c)
    step = np.where(idx >= 0, c["step"][np.maximum(idx, 0)], 2 * c["eta"]) * s_mod
    var = np.where(aS > 0, step ** 2 / (6.0 if comp.stochastic else 12.0), 0.0)
    return err, var


@dataclasses.dataclass
class Prediction:
    """``exact``: the float64 sum (per output element); ``bound``: rigorous bound of
    ``|result - exact|``; ``var``: model variance of the error; ``rms``: ``sqrt(mean(var))``;
    ``events``: quantizations on each element's path (max over elements)."""

    exact: np.ndarray
    bound: np.ndarray
    var: np.ndarray
    events: int

    @property
    def rms(self) -> float:
        return float(np.sqrt(np.mean(self.var))) if self.var.size else 0.0


def predict(xs, comp: Compression, op: str = "all_reduce", algo: str = "ring") -> Prediction:
    """Walk the schedule of ``op`` with exact partial sums; see the module docstring.

    For ``all_reduce`` the arrays describe every rank's (identical) result; for
    ``reduce_scatter`` the concatenation of the owners' chunks.
    """
    arr, _ = as_rank_inputs(xs)
    if op not in ("all_reduce", "reduce_scatter"):
        raise ValueError(f"predict covers all_reduce and reduce_scatter, not {op!r}")
    N, n = arr.shape
    sched = build_schedule(op, algo, N)
    bounds = chunk_bounds(n, N, comp.block)
    S = arr.astype(np.float64)
    B = np.zeros_like(S)
    V = np.zeros_like(S)
    K = np.zeros(S.shape, np.int64)
    sl = [slice(bounds[c], bounds[c + 1]) for c in range(N)]
    for step in sched.steps:
        if step.phase != "reduce":
            continue
        msgs = []
        for t in step.transfers:
            parts = []
            for ch in t.chunks:
                err, var = _event(S[t.src, sl[ch]], B[t.src, sl[ch]], comp)
                parts.append((ch, S[t.src, sl[ch]].copy(), B[t.src, sl[ch]] + err,
                              V[t.src, sl[ch]] + var, K[t.src, sl[ch]] + 1))
            msgs.append((t.dst, parts))
        for dst, parts in msgs:
            for ch, s, b, v, k in parts:
                Snew = S[dst, sl[ch]] + s
                B[dst, sl[ch]] = B[dst, sl[ch]] + b + _E32 * (np.abs(Snew) + B[dst, sl[ch]] + b)
                S[dst, sl[ch]] = Snew
                V[dst, sl[ch]] += v
                K[dst, sl[ch]] = np.maximum(K[dst, sl[ch]], k)
    exact = np.concatenate([S[c, sl[c]] for c in range(N)])
    bound = np.concatenate([B[c, sl[c]] for c in range(N)])
    var = np.concatenate([V[c, sl[c]] for c in range(N)])
    events = np.concatenate([K[c, sl[c]] for c in range(N)])
    if op == "all_reduce" and N > 1:  # the owner quantizes its finished chunk once
        fin = [_event(S[c, sl[c]], B[c, sl[c]], comp) for c in range(N)]
        bound = bound + np.concatenate([e for e, _ in fin])
        var = var + np.concatenate([v for _, v in fin])
        events = events + 1
    return Prediction(exact, bound, var, int(events.max()) if events.size else 0)


def first_order_bound(xs, comp: Compression, algo: str = "ring") -> np.ndarray:
    """The closed form of the docs, first order in ``u``, for all-reduce:
    ``f u (hops + 1) sum_r |x_r|`` per element, ``hops`` = N - 1 (ring) or ceil(log2 N) (tree).
    Not rigorous (it drops the compounding and the subnormal floor); :func:`predict` is."""
    arr, _ = as_rank_inputs(xs)
    N = arr.shape[0]
    hops = N - 1 if algo == "ring" else (N - 1).bit_length()
    f = 1.0 if comp.rounding in ("nearest_even", "nearest_away") else 2.0
    return f * format_constants(comp.fmt)["u"] * (hops + (1 if N > 1 else 0)) * \
        np.abs(arr.astype(np.float64)).sum(axis=0)


def measure(xs, comp: Compression, op: str = "all_reduce", algo: str = "ring") -> dict:
    """Emulate ``op`` and compare with the float64 sum and with :func:`predict`."""
    arr, _ = as_rank_inputs(xs)
    p = predict(arr, comp, op, algo)
    res = run(op, arr, comp, algo)
    got = res.outputs[0].astype(np.float64) if op == "all_reduce" else \
        np.concatenate(res.outputs).astype(np.float64)
    err = got - p.exact
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p.bound > 0, np.abs(err) / p.bound, np.where(err == 0, 0.0, np.inf))
    ref = float(np.sqrt(np.mean(p.exact ** 2)))
    return {
        "rms_measured": float(np.sqrt(np.mean(err ** 2))),
        "rms_predicted": p.rms,
        "rel_rms": float(np.sqrt(np.mean(err ** 2))) / ref if ref else 0.0,
        "max_abs_err": float(np.max(np.abs(err))) if err.size else 0.0,
        "max_err_over_bound": float(np.max(ratio)) if err.size else 0.0,
        "mean_bound_over_abs_exact": float(np.median(p.bound / np.maximum(np.abs(p.exact), 1e-30))),
        "events": p.events,
        "wire_bytes_per_rank": max(res.wire_bytes),
    }


def wire_bytes(n: int, ranks: int, comp: Compression, op: str = "all_reduce",
               algo: str = "ring") -> dict:
    """Bytes the busiest rank sends, for the 8-bit collective and for NCCL-style bf16 / fp32
    collectives of the same algorithm (chunks of 2 or 4 bytes per element, no scales).

    >>> w = wire_bytes(1 << 20, 8, Compression("e4m3", block=128))
    >>> w["fp8"], w["bf16"], round(w["bf16"] / w["fp8"], 3)
    (1892352, 3670016, 1.939)
    """
    sched = build_schedule(op, algo, ranks)
    b = chunk_bounds(n, ranks, comp.block)
    sizes = [b[c + 1] - b[c] for c in range(ranks)]
    out = {"fp8": 0, "bf16": 0, "fp32": 0}
    for r in range(ranks):
        tot = {"fp8": 0, "bf16": 0, "fp32": 0}
        for st in sched.steps:
            t = st.send_of(r)
            if t is None:
                continue
            sz = [sizes[c] for c in t.chunks]
            tot["fp8"] += comp.message_nbytes(sz)
            tot["bf16"] += 2 * sum(sz)
            tot["fp32"] += 4 * sum(sz)
        for k in out:
            out[k] = max(out[k], tot[k])
    return out


def error_table(ranks=(2, 4, 8, 16), formats=("e4m3", "e5m2", "hif8"), blocks=(32, 128, 1024),
                roundings=("nearest", "stochastic"), algos=("ring", "tree"), n: int = 1 << 14,
                seed: int = 0) -> list[dict]:
    """Rows of the error table: all-reduce of N(0, 1) float32 gradients, one tensor per rank."""
    rows = []
    for N in ranks:
        xs = np.random.default_rng(seed + N).standard_normal((N, n)).astype(np.float32)
        for fmt in formats:
            for blk in blocks:
                for rnd in roundings:
                    comp = Compression(fmt, block=blk,
                                       **({"rounding": "stochastic", "seed": seed + 1}
                                          if rnd == "stochastic" else {}))
                    for algo in algos:
                        m = measure(xs, comp, "all_reduce", algo)
                        rows.append({"ranks": N, "fmt": fmt, "block": blk, "rounding": rnd,
                                     "algo": algo, **m})
    return rows
