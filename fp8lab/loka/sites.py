"""Sites and candidates: the vocabulary of the LoKA engine.

A *site* is one GEMM call site ``C = A @ B.T`` of a model (``A``: M x K, the left operand, usually
activations; ``B``: N x K, the right operand, usually a weight stored output-major), with the
operation that follows it. A *candidate* is one way to run it in 8 bits: a format per operand, a
scaling recipe, power-of-two scales or not, delayed scaling or not, and an accumulation model.

>>> from fp8lab.loka.sites import Site, Candidate
>>> s = Site("mlp.0", m=64, n=32, k=128, follow="layernorm")
>>> s.flops
524288
>>> Candidate.parse("e4m3/e4m3:channel:pow2").label
'e4m3/e4m3:channel:pow2'
"""

from __future__ import annotations

import dataclasses
import re

from ..formats import get_format

__all__ = ["FOLLOW_OPS", "GRANULARITIES", "Site", "Candidate", "default_candidates"]

#: Operations that may follow a site's GEMM; the error budget is judged after them.
FOLLOW_OPS = ("none", "relu", "layernorm", "rmsnorm")

#: Scaling granularities, coarsest first (the order Mods uses to pick the coarsest safe one).
#: ``channel`` = one scale per row of each operand (per output row of A, per output channel of B);
#: ``block:b`` = 1 x b blocks along K; ``tile:b`` = b x b tiles; ``mx`` = 1 x 32 blocks with
#: power-of-two (E8M0) scales, OCP MX convention.
GRANULARITIES = ("tensor", "channel", "tile:128", "block:128", "mx")

ACCUMULATE = ("fp32", "exact")

#: The precision of the model itself: a candidate that does not quantize.
HIGH = "high"


def _check_granularity(g: str) -> str:
    m = re.fullmatch(r"(tensor|channel|row|mx|block:(\d+)|tile:(\d+))", g)
    if not m:
        raise ValueError(f"unknown scaling {g!r}; known: tensor, channel, block:<b>, tile:<b>, mx")
    if g == "row":
        return "channel"
    b = m.group(2) or m.group(3)
    if b is not None and int(b) < 1:
        raise ValueError(f"block size must be >= 1 in {g!r}")
    return g


def block_shape(g: str) -> tuple[int, int] | None:
    """(rows, cols) of one scaling group, ``None`` for whole-tensor / whole-row groups."""
    if g == "mx":
        return (1, 32)
    if g.startswith("block:"):
        return (1, int(g.split(":")[1]))
    if g.startswith("tile:"):
        b = int(g.split(":")[1])
        return (b, b)
    return None


@dataclasses.dataclass(frozen=True)
class Site:
    """One GEMM call site, ``C = A @ B.T`` with ``A`` (m, k) and ``B`` (n, k).

    Parameters
    ----------
    name : str
    m, n, k : int
        Shapes (m varies with the batch; the recorded value is the one probed).
    follow : {"none", "relu", "layernorm", "rmsnorm"}
        What follows the GEMM (errors are judged after it).
    roles : (str, str)
        Roles of A and B, e.g. ``("activation", "weight")``, ``("grad", "activation")``.
    position : {"inner", "first", "logit"}
        Where the site sits; precision gating keeps first and logit layers in high precision.
    cached : tuple of str
        Operand roles whose 8-bit copy is reused across calls (no cast cost per call).
    """

    name: str
    m: int
    n: int
    k: int
    follow: str = "none"
    roles: tuple[str, str] = ("activation", "weight")
    position: str = "inner"
    cached: tuple[str, ...] = ()

    def __post_init__(self):
        for d in ("m", "n", "k"):
            v = getattr(self, d)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"site {self.name!r}: {d} must be a positive int, got {v!r}")
        if self.follow not in FOLLOW_OPS:
            raise ValueError(f"site {self.name!r}: unknown follow {self.follow!r}; known: "
                             + ", ".join(FOLLOW_OPS))
        if self.position not in ("inner", "first", "logit"):
            raise ValueError(f"site {self.name!r}: position must be inner, first or logit")
        object.__setattr__(self, "roles", tuple(self.roles))
        object.__setattr__(self, "cached", tuple(self.cached))

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Site":
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to run a site: formats of A and B, scaling, pow2 scales, delayed scaling, accumulation.

    ``fmt_a == "high"`` (and ``fmt_b``) is the model's own precision (no quantization).
    """

    fmt_a: str
    fmt_b: str
    scaling: str = "tensor"
    pow2: bool = False
    delayed: bool = False
    accumulate: str = "fp32"

    def __post_init__(self):
        for f in ("fmt_a", "fmt_b"):
            v = getattr(self, f)
            if v != HIGH:
                object.__setattr__(self, f, get_format(v).name)
        if (self.fmt_a == HIGH) != (self.fmt_b == HIGH):
            raise ValueError("either both operands are 8-bit or neither is")
        object.__setattr__(self, "scaling", _check_granularity(self.scaling))
        if self.accumulate not in ACCUMULATE:
            raise ValueError(f"unknown accumulate {self.accumulate!r}; known: " + ", ".join(ACCUMULATE))
        if self.delayed and self.scaling != "tensor":
            raise ValueError("delayed scaling is a per-tensor recipe (scaling='tensor')")
        if self.scaling == "mx" and not self.pow2:
            object.__setattr__(self, "pow2", True)  # MX scales are E8M0 by definition

    @property
    def is_high(self) -> bool:
        return self.fmt_a == HIGH

    @property
    def label(self) -> str:
        if self.is_high:
            return HIGH
        s = f"{self.fmt_a}/{self.fmt_b}:{self.scaling}"
        if self.pow2 and self.scaling != "mx":
            s += ":pow2"
        if self.delayed:
            s += ":delayed"
        if self.accumulate != "fp32":
            s += f":acc={self.accumulate}"
        return s

    @classmethod
    def parse(cls, text: str) -> "Candidate":
        """Parse a label such as ``e4m3/e5m2:block:128:pow2`` or ``high``."""
        if text == HIGH:
            return cls(HIGH, HIGH)
        fmts, _, rest = text.partition(":")
        fa, _, fb = fmts.partition("/")
        fb = fb or fa
        parts = rest.split(":") if rest else ["tensor"]
        gran = parts.pop(0)
        if gran in ("block", "tile"):
            gran += ":" + parts.pop(0)
        kw = {}
        for p in parts:
            if p == "pow2":
                kw["pow2"] = True
            elif p == "delayed":
                kw["delayed"] = True
            elif p.startswith("acc="):
                kw["accumulate"] = p[4:]
            else:
                raise ValueError(f"unknown candidate option {p!r} in {text!r}; known: pow2, delayed, acc=")
        return cls(fa, fb, gran, **kw)


def default_candidates(formats=("e4m3", "e5m2"), granularities=GRANULARITIES) -> list[Candidate]:
    """The high-precision candidate plus ``format x granularity`` (same format for A and B)."""
    out = [Candidate(HIGH, HIGH)]
    for f in formats:
        for g in granularities:
            out.append(Candidate(f, f, g))
    return out
