"""N ranks on the CPU: the quantized collectives, bit-identical to the NCCL path.

Each function takes every rank's input at once and returns every rank's output. The ranks run the
same per-rank program as the GPU path (:mod:`fp8lab.collectives._engine`), in lockstep over the
same step list (:mod:`fp8lab.collectives.schedule`): at each step all ranks build their messages,
then every message is handed (as a copy of its bytes) to its receiver.

>>> import numpy as np
>>> from fp8lab.collectives import Compression, emulate
>>> xs = np.array([[1.0, 2.0, 3.0, 4.0], [0.5, 0.25, -3.0, 8.0]], dtype=np.float32)
>>> out = emulate.all_reduce(xs, Compression("e4m3", block=2))
>>> out[0], bool((out == out[0]).all())
(array([ 1.4464285 ,  2.25      , -0.14732143, 12.        ], dtype=float32), True)
>>> [c.tolist() for c in emulate.reduce_scatter(xs, Compression("e4m3", block=2))]
[[1.5, 2.25], [-0.14285707473754883, 12.0]]

The exact sum is ``[1.5, 2.25, 0, 12]``: the block ``[-3, 8]`` (scale 8/448) cannot hold the 3.0
exactly, and the error of that partial sum stays in the result. The all-gather then quantizes the
finished chunks once more.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..codecs import decode, encode
from ._engine import RankProgram
from .schedule import ALGOS, build_schedule, chunk_bounds
from .wire import Compression

__all__ = ["all_reduce", "reduce_scatter", "all_gather", "run", "Run", "as_rank_inputs"]

_ACCEPTED = "float32, float16 or bfloat16 (exact in float32; accumulation is in float32)"


def as_rank_inputs(xs) -> tuple[np.ndarray, tuple]:
    """``xs`` (a sequence of N equally shaped arrays, or an array whose first axis is the rank)
    as an (N, n) float32 array and the per-rank shape."""
    if isinstance(xs, np.ndarray):
        if xs.ndim < 1 or xs.shape[0] < 1:
            raise ValueError(f"expected one array per rank (first axis = ranks), got shape {xs.shape}")
        arrs = list(xs)
    elif isinstance(xs, (list, tuple)):
        if not xs:
            raise ValueError("expected one array per rank, got an empty sequence")
        arrs = [np.asarray(a) for a in xs]
    else:
        raise TypeError(f"expected a sequence of per-rank arrays or an ndarray with the ranks on "
                        f"axis 0, got {type(xs).__name__}")
    shape = np.shape(arrs[0])
    for r, a in enumerate(arrs):
        a = np.asarray(a)
        if a.shape != shape:
            raise ValueError(f"rank {r} has shape {a.shape}, rank 0 has {shape}: every rank must "
                             f"hold a tensor of the same shape")
        if a.dtype.name not in ("float32", "float16", "bfloat16"):
            raise TypeError(f"rank {r} holds {a.dtype.name}; accepted: {_ACCEPTED}. Convert "
                            f"float64 explicitly (it would be rounded)")
    out = np.stack([np.asarray(a).astype(np.float32).reshape(-1) for a in arrs])
    if not np.isfinite(out).all():
        raise ValueError("inputs must be finite (NaN or Inf found): a block's scale would be NaN")
    return out, shape


def _check_comp(comp):
    if comp is None:
        return Compression()
    if not isinstance(comp, Compression):
        raise TypeError(f"compression must be a Compression (e.g. Compression('e4m3', block=128)), "
                        f"got {type(comp).__name__}")
    return comp


@dataclasses.dataclass
class Run:
    """Outputs of an emulated collective and what it sent.

    ``outputs[r]``: rank r's result (1-D float32). ``wire_bytes[r]``: bytes rank r sent.
    ``messages``: (phase, step, src, dst, nbytes) of every message.
    """

    outputs: list
    wire_bytes: list
    messages: list
    bounds: tuple


def run(op: str, xs2d: np.ndarray, comp: Compression, algo: str = "ring") -> Run:
    """Run collective ``op`` on an (N, n) float32 array (rank-major), returning a :class:`Run`.

    For ``all_gather``, row ``r`` holds rank r's chunk at its place in the full vector (other
    entries are ignored).
    """
    comp = _check_comp(comp)
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; known: {', '.join(ALGOS)}")
    N, n = xs2d.shape
    sched = build_schedule(op, algo, N)
    bounds = chunk_bounds(n, N, comp.block)
    progs = [RankProgram(np, encode, decode, r, sched, bounds, comp, xs2d[r].copy())
             for r in range(N)]
    sent = [0] * N
    messages = []
    for step in sched.steps:
        out = [p.outgoing(step) for p in progs]
        for t in step.transfers:
            buf = out[t.src]
            expected = progs[t.dst].nbytes(t.chunks)
            if buf.size != expected:  # the receiver sizes its buffer from the schedule alone
                raise AssertionError(f"message of {buf.size} bytes, receiver expects {expected}")
            sent[t.src] += buf.size
            messages.append((step.phase, step.index, t.src, t.dst, int(buf.size)))
            progs[t.dst].incoming(step, buf.copy())
    return Run([p.result() for p in progs], sent, messages, bounds)


def all_reduce(xs, compression: Compression | None = None, *, algo: str = "ring") -> np.ndarray:
    """Quantized all-reduce (sum) of one tensor per rank.

    Parameters
    ----------
    xs : sequence of N arrays of one shape, or an array with the ranks on axis 0
        float32, float16 or bfloat16.
    compression : Compression
        Format, block size, rounding, seed (default: e4m3, block 128, nearest).
    algo : {"ring", "tree"}

    Returns
    -------
    numpy.ndarray of float32, shape (N, *shape): every rank's result (all rows are identical).
    """
    arr, shape = as_rank_inputs(xs)
    res = run("all_reduce", arr, compression, algo)
    return np.stack(res.outputs).reshape((arr.shape[0],) + tuple(shape))


def reduce_scatter(xs, compression: Compression | None = None, *, algo: str = "ring") -> list:
    """Quantized reduce-scatter: rank r gets chunk r of the sum (1-D float32; chunks follow
    :func:`~fp8lab.collectives.schedule.chunk_bounds` of the flattened tensor, possibly empty)."""
    arr, _ = as_rank_inputs(xs)
    return run("reduce_scatter", arr, compression, algo).outputs


def all_gather(chunks, compression: Compression | None = None, *, algo: str = "ring") -> np.ndarray:
    """Quantized all-gather: rank r contributes chunk r (sizes as :func:`reduce_scatter` returns
    them); returns (N, n) float32, every rank's gathered vector (all rows identical)."""
    comp = _check_comp(compression)
    if not isinstance(chunks, (list, tuple)) or not chunks:
        raise TypeError("expected a non-empty list with one 1-D chunk per rank")
    cs = [np.asarray(c) for c in chunks]
    for r, c in enumerate(cs):
        if c.dtype.name not in ("float32", "float16", "bfloat16") or c.ndim != 1:
            raise TypeError(f"chunk {r} is a {c.ndim}-d {c.dtype.name} array; expected 1-D {_ACCEPTED}")
    N, n = len(cs), sum(c.size for c in cs)
    bounds = chunk_bounds(n, N, comp.block)
    sizes = [bounds[r + 1] - bounds[r] for r in range(N)]
    if [c.size for c in cs] != sizes:
        raise ValueError(f"chunk sizes {[c.size for c in cs]} do not match the layout of "
                         f"{n} elements on {N} ranks with block {comp.block}: expected {sizes}")
    full = np.zeros((N, n), np.float32)
    for r, c in enumerate(cs):
        full[r, bounds[r]:bounds[r + 1]] = c.astype(np.float32)
    if not np.isfinite(full).all():
        raise ValueError("inputs must be finite (NaN or Inf found)")
    return np.stack(run("all_gather", full, comp, algo).outputs)
