"""Ring and tree schedules as explicit step lists.

A schedule is data: a tuple of :class:`Step`, each a set of :class:`Transfer` (``src`` sends the
listed chunks to ``dst``). The CPU emulation (:mod:`fp8lab.collectives.emulate`) and the NCCL path
(:mod:`fp8lab.collectives.nccl`) both walk the same tuple with the same per-rank code, which is
what makes their results bit-identical.

The tensor (flattened, ``n`` elements) is cut into ``ranks`` chunks along block boundaries, so a
quantization block never straddles two chunks; rank ``r`` owns chunk ``r`` (its reduce-scatter
output). With ``nblocks = ceil(n / block)`` the chunks get ``nblocks // ranks`` blocks each and the
first ``nblocks % ranks`` chunks one more; only the last block of the tensor may be partial, and a
chunk may be empty when there are fewer blocks than ranks::

    n = 10, block = 2, ranks = 3:  blocks |01|23|45|67|89|   chunks [0, 4) [4, 8) [8, 10)

Ring reduce-scatter (``ranks - 1`` steps): at step ``s`` rank ``r`` sends chunk
``(r - s - 1) mod N`` to ``r + 1``, which adds its own data. Chunk ``c`` therefore travels
``c+1 -> c+2 -> ... -> c`` and is complete at its owner after ``N - 1`` hops.

Tree reduce-scatter (``ceil(log2 N)`` steps): chunk ``c`` is reduced over a binomial tree rooted at
rank ``c``. With ``rel = (r - c) mod N``, rank ``r`` sends chunk ``c`` at level ``l = lsb(rel)``
to rank ``r - 2^l``. All the chunks a rank sends at one level go to the same peer, so each step is
one message per rank, as in the ring; every chunk reaches its owner after at most
``ceil(log2 N)`` hops.

All-gather, ring: at step ``s`` rank ``r`` forwards chunk ``(r - s) mod N`` to ``r + 1``.
All-gather, tree: binomial broadcast of chunk ``c`` from rank ``c``; at level ``l`` (descending),
rank ``r`` with ``rel mod 2^(l+1) == 0`` and ``rel + 2^l < N`` sends chunk ``c`` to ``r + 2^l``.

>>> from fp8lab.collectives.schedule import build_schedule
>>> s = build_schedule("all_reduce", "ring", 3)
>>> [(st.phase, st.index, [(t.src, t.dst, t.chunks) for t in st.transfers]) for st in s.steps][:2]
[('reduce', 0, [(0, 1, (2,)), (1, 2, (0,)), (2, 0, (1,))]), ('reduce', 1, [(0, 1, (1,)), (1, 2, (2,)), (2, 0, (0,))])]
>>> chunk_bounds(10, 3, 2)
(0, 4, 8, 10)
"""

from __future__ import annotations

import dataclasses
import numbers

__all__ = ["Transfer", "Step", "Schedule", "build_schedule", "chunk_bounds", "OPS", "ALGOS",
           "PHASES"]

#: Collective operations, schedule algorithms and step phases.
OPS = ("all_reduce", "reduce_scatter", "all_gather")
ALGOS = ("ring", "tree")
PHASES = ("reduce", "gather")


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def chunk_bounds(n: int, ranks: int, block: int) -> tuple[int, ...]:
    """Element offsets of the ``ranks`` chunks of an ``n``-element tensor: chunk ``c`` is
    ``[bounds[c], bounds[c + 1])``. Chunk boundaries fall on multiples of ``block``."""
    n = _check_int("n", n, 0)
    ranks = _check_int("ranks", ranks, 1)
    block = _check_int("block", block, 1)
    nblocks = -(-n // block)
    q, rem = divmod(nblocks, ranks)
    out, b = [0], 0
    for c in range(ranks):
        b += q + (1 if c < rem else 0)
        out.append(min(b * block, n))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Rank ``src`` sends ``chunks`` (ascending chunk indices, one message) to rank ``dst``."""

    src: int
    dst: int
    chunks: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Step:
    """One communication step: every rank sends at most one message and receives at most one.

    ``phase`` is "reduce" (the receiver adds the decoded message to its partial sums) or "gather"
    (the receiver stores the message's codes and scales and forwards them unchanged later);
    ``index`` counts steps within the phase (it keys the stochastic-rounding seeds).
    """

    phase: str
    index: int
    transfers: tuple[Transfer, ...]

    def send_of(self, rank: int) -> Transfer | None:
        return next((t for t in self.transfers if t.src == rank), None)

    def recv_of(self, rank: int) -> Transfer | None:
        return next((t for t in self.transfers if t.dst == rank), None)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The steps of one collective on ``ranks`` ranks (validated at construction)."""

    op: str
    algo: str
    ranks: int
    steps: tuple[Step, ...]

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown collective {self.op!r}; known: {', '.join(OPS)}")
        if self.algo not in ALGOS:
            raise ValueError(f"unknown algorithm {self.algo!r}; known: {', '.join(ALGOS)}")
        for st in self.steps:
            if st.phase not in PHASES:
                raise ValueError(f"unknown phase {st.phase!r}; known: {', '.join(PHASES)}")
            srcs = [t.src for t in st.transfers]
            dsts = [t.dst for t in st.transfers]
            if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
                raise ValueError(f"step {st.phase}/{st.index}: a rank sends or receives twice")
            for t in st.transfers:
                if not (0 <= t.src < self.ranks and 0 <= t.dst < self.ranks) or t.src == t.dst:
                    raise ValueError(f"step {st.phase}/{st.index}: bad transfer {t}")
                if list(t.chunks) != sorted(set(t.chunks)) or not t.chunks:
                    raise ValueError(f"step {st.phase}/{st.index}: chunks must be ascending: {t}")

    @property
    def hops(self) -> int:
        """Number of steps (the latency term: each step is one message per rank)."""
        return len(self.steps)


def _lsb(v: int) -> int:
    return (v & -v).bit_length() - 1


def _levels(ranks: int) -> int:
    return (ranks - 1).bit_length()  # ceil(log2 ranks); 0 for one rank


def _ring_reduce(N):
    return [Step("reduce", s, tuple(Transfer(r, (r + 1) % N, ((r - s - 1) % N,)) for r in range(N)))
            for s in range(N - 1)]


def _ring_gather(N):
    return [Step("gather", s, tuple(Transfer(r, (r + 1) % N, ((r - s) % N,)) for r in range(N)))
            for s in range(N - 1)]


def _tree_reduce(N):
    steps = []
    for l in range(_levels(N)):
        ts = []
        for r in range(N):
            chunks = tuple(c for c in range(N) if (r - c) % N and _lsb((r - c) % N) == l)
            if chunks:
                ts.append(Transfer(r, (r - (1 << l)) % N, chunks))
        steps.append(Step("reduce", l, tuple(ts)))
    return steps


def _tree_gather(N):
    steps = []
    L = _levels(N)
    for i, l in enumerate(range(L - 1, -1, -1)):
        ts = []
        for r in range(N):
            chunks = tuple(c for c in range(N)
                           if ((r - c) % N) % (1 << (l + 1)) == 0 and (r - c) % N + (1 << l) < N)
            if chunks:
                ts.append(Transfer(r, (r + (1 << l)) % N, chunks))
        steps.append(Step("gather", i, tuple(ts)))
    return steps


def build_schedule(op: str, algo: str, ranks: int) -> Schedule:
    """The step list of collective ``op`` ("all_reduce", "reduce_scatter", "all_gather") with
    algorithm ``algo`` ("ring", "tree") on ``ranks`` ranks. All-reduce is the reduce-scatter
    steps followed by the all-gather steps of the same algorithm."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; known: {', '.join(ALGOS)}")
    N = _check_int("ranks", ranks, 1)
    reduce_, gather = (_ring_reduce, _ring_gather) if algo == "ring" else (_tree_reduce, _tree_gather)
    steps = []
    if op in ("all_reduce", "reduce_scatter"):
        steps += reduce_(N)
    if op in ("all_reduce", "all_gather"):
        steps += gather(N)
    return Schedule(op, algo, N, tuple(steps))
