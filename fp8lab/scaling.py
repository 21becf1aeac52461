"""Scaling recipes: how a tensor is cut into blocks and how each block's scale is chosen.

Convention (everywhere in fp8lab): a quantized tensor stores codes ``c`` and float32 scales ``s``
with ``x ~= decode(c) * s``. Every element uses the scale of its block, and the scale array has
the tensor's number of dimensions::

    scales.shape[d] = ceil(x.shape[d] / block_shape[d])
    element x[i] uses scales[i // block_shape]            (element-wise over the axes)

``block_shape`` depends on the recipe (see :meth:`Scaling.block_shape`):

========================  ========================================  ==============================
recipe                    block_shape for x of shape (..., R, C)    scales shape for (M, K)
========================  ========================================  ==============================
``per_tensor()``          the whole shape                           (1, 1)
``per_channel(axis=-1)``  ``x.shape[axis]`` along ``axis``, else 1   (M, 1): one scale per row
``per_block(B, axis=-1)`` ``B`` along ``axis``, else 1               (M, ceil(K/B))
``per_tile(T)``           ``T`` on the last two axes, else 1         (ceil(M/T), ceil(K/T))
``mx(B)``                 ``B`` along ``axis``, else 1               (M, ceil(K/B))
========================  ========================================  ==============================

``axis`` is the axis the scale is shared *along* (the reduction axis K of a GEMM), so the
defaults give the DeepGEMM / Transformer Engine layouts: per-row activation scales, 1x128
activation blocks and 128x128 weight tiles. The last block along an axis may be partial.

>>> from fp8lab.scaling import Scaling
>>> s = Scaling.per_block(128)
>>> str(s), s.scale_shape((303, 300)), s.cost_rank
('block:128', (303, 3), 3)
>>> Scaling.parse("tile:64,pow2") == Scaling.per_tile(64, pow2=True)
True
>>> Scaling.mx().scale_shape((4, 100))
(4, 4)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections import deque

import numpy as np

from .formats import Format, get_format

__all__ = [
    "Scaling",
    "DelayedScaling",
    "compute_scale",
    "MX_ELEMENT_FORMATS",
    "SCALE_MIN",
    "SCALE_MAX",
    "KINDS",
]

#: Recipe kinds, cheapest first (the index is :attr:`Scaling.cost_rank`).
KINDS = ("tensor", "channel", "tile", "block", "mx")

#: Element formats of the OCP Microscaling (MX) specification v1.0 among fp8lab's formats. The MX
#: scale rule X = 2^(floor(log2 amax) - emax_elem) is defined for these element types only.
MX_ELEMENT_FORMATS = ("e4m3", "e5m2")

#: Scales are clamped to [2^-127, 2^127], the range of an E8M0 scale (float32 holds it exactly).
SCALE_MIN = 2.0 ** -127
SCALE_MAX = 2.0 ** 127

# scale rules, as passed to the kernels
RULE_AMAX, RULE_POW2, RULE_MX, RULE_MX_UP = 0, 1, 2, 3

_PARSE_FORMS = ('"tensor", "channel", "channel:AXIS", "block", "block:B", "tile", "tile:B", '
                '"mx", "mx:B", "mx_up", "mx_up:B", each optionally followed by ",axis=A" '
                '(channel, block, mx), ",pow2" and ",margin=M"')


def _check_int(name: str, value, *, minimum=None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class Scaling:
    """A scaling recipe (frozen, validated). Build it with a named constructor or :meth:`parse`.

    Attributes
    ----------
    kind : {"tensor", "channel", "block", "tile", "mx"}
    block : int or None
        Block length (``block``, ``mx``) or tile side (``tile``); None otherwise.
    axis : int or None
        The axis along which a scale is shared (``channel``, ``block``, ``mx``); may be negative.
    pow2 : bool
        Round each scale up to a power of two (always true for ``mx``).
    margin : int
        Headroom: the scale is multiplied by ``2**margin`` (``margin >= 0``).
    round_up : bool
        ``mx`` only: the variant that rounds the scale up so that nothing overflows.
    """

    kind: str
    block: int | None = None
    axis: int | None = None
    pow2: bool = False
    margin: int = 0
    round_up: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown scaling kind {self.kind!r}; known: {', '.join(KINDS)}")
        if self.kind in ("block", "tile", "mx"):
            object.__setattr__(self, "block", _check_int("block", self.block, minimum=1))
        elif self.block is not None:
            raise ValueError(f"{self.kind} scaling takes no block size (got block={self.block!r})")
        if self.kind in ("channel", "block", "mx"):
            object.__setattr__(self, "axis", _check_int("axis", self.axis))
        elif self.axis is not None:
            raise ValueError(f"{self.kind} scaling takes no axis (got axis={self.axis!r}); "
                             "tiles always cover the last two axes")
        if not isinstance(self.pow2, (bool, np.bool_)):
            raise ValueError(f"pow2 must be a bool, got {self.pow2!r}")
        if not isinstance(self.round_up, (bool, np.bool_)):
            raise ValueError(f"round_up must be a bool, got {self.round_up!r}")
        object.__setattr__(self, "margin", _check_int("margin", self.margin, minimum=0))
        if self.kind == "mx":
            if not self.pow2:
                raise ValueError("mx scales are powers of two (E8M0): pow2 must be True")
        elif self.round_up:
            raise ValueError(f"round_up applies to mx scaling only, not {self.kind}")

    # ----------------------------------------------------------------- named constructors
    @classmethod
    def per_tensor(cls, *, pow2: bool = False, margin: int = 0) -> "Scaling":
        """One scale for the whole tensor."""
        return cls("tensor", pow2=pow2, margin=margin)

    @classmethod
    def per_channel(cls, axis: int = -1, *, pow2: bool = False, margin: int = 0) -> "Scaling":
        """One scale per index of every axis but ``axis`` (shared along ``axis``).

        The default, ``axis=-1``, gives one scale per row: per-token activations, or per-output-
        channel weights of an (N, K) weight in ``C = A @ W.T``.
        """
        return cls("channel", axis=axis, pow2=pow2, margin=margin)

    @classmethod
    def per_block(cls, block: int = 128, axis: int = -1, *, pow2: bool = False,
                  margin: int = 0) -> "Scaling":
        """1 x ``block`` blocks along ``axis`` (the reduction axis): DeepGEMM's activation layout."""
        return cls("block", block=block, axis=axis, pow2=pow2, margin=margin)

    @classmethod
    def per_tile(cls, tile: int = 128, *, pow2: bool = False, margin: int = 0) -> "Scaling":
        """``tile`` x ``tile`` tiles over the last two axes: DeepGEMM's weight layout."""
        return cls("tile", block=tile, pow2=pow2, margin=margin)

    @classmethod
    def mx(cls, block: int = 32, round_up: bool = False, *, axis: int = -1,
           margin: int = 0) -> "Scaling":
        """OCP MX blocks: ``block`` elements along ``axis`` sharing a power-of-two (E8M0) scale.

        The scale is ``X = 2^(floor(log2 amax) - emax_elem)`` (OCP MX v1.0, section 6.3), with
        ``emax_elem`` the exponent of the element format's largest value. Elements up to
        ``2^(emax_elem+1)`` can then exceed the format's max: the specification clamps them, so
        :func:`fp8lab.quantize` saturates by default for this recipe. ``round_up=True`` takes
        ``X = 2^ceil(log2(amax / max))`` instead, which never overflows.
        """
        return cls("mx", block=block, axis=axis, pow2=True, margin=margin, round_up=round_up)

    # ----------------------------------------------------------------- text form
    @classmethod
    def parse(cls, text: str) -> "Scaling":
        """Build a recipe from its text form (the inverse of ``str``).

        >>> Scaling.parse("channel:0")
        Scaling(kind='channel', block=None, axis=0, pow2=False, margin=0, round_up=False)
        >>> str(Scaling.parse("mx_up"))
        'mx_up:32'
        >>> Scaling.parse("blocks")
        Traceback (most recent call last):
            ...
        ValueError: unknown scaling 'blocks'; accepted: "tensor", "channel", "channel:AXIS", "block", "block:B", "tile", "tile:B", "mx", "mx:B", "mx_up", "mx_up:B", each optionally followed by ",axis=A" (channel, block, mx), ",pow2" and ",margin=M"
        """
        if isinstance(text, Scaling):
            return text
        if not isinstance(text, str):
            raise ValueError(f"a scaling is a Scaling or a string, not {type(text).__name__}; "
                             f"accepted strings: {_PARSE_FORMS}")
        bad = ValueError(f"unknown scaling {text!r}; accepted: {_PARSE_FORMS}")
        head, *opts = [p.strip() for p in text.strip().lower().split(",")]
        name, _, arg = head.partition(":")
        kw: dict = {}
        for opt in opts:
            key, eq, val = opt.partition("=")
            try:
                if key == "pow2" and not eq:
                    kw["pow2"] = True
                elif key in ("margin", "axis") and eq:
                    kw[key] = int(val)
                else:
                    raise bad
            except ValueError:
                raise bad from None
        try:
            num = int(arg) if arg else None
        except ValueError:
            raise bad from None
        if name == "tensor" and num is None and "axis" not in kw:
            return cls.per_tensor(**kw)
        if name == "channel" and not (num is not None and "axis" in kw):
            if num is not None:
                kw["axis"] = num
            return cls.per_channel(**kw)
        if name in ("block", "tile", "mx", "mx_up") and num is not None and num < 1:
            raise ValueError(f"block size must be >= 1, got {num} in {text!r}")
        if name == "block":
            return cls.per_block(128 if num is None else num, **kw)
        if name == "tile" and "axis" not in kw:
            return cls.per_tile(128 if num is None else num, **kw)
        if name in ("mx", "mx_up") and not kw.get("pow2", True) is False:
            kw.pop("pow2", None)
            return cls.mx(32 if num is None else num, round_up=name == "mx_up", **kw)
        raise bad

    def __str__(self) -> str:
        if self.kind == "tensor":
            head = "tensor"
        elif self.kind == "channel":
            head = f"channel:{self.axis}"
        elif self.kind == "mx":
            head = f"{'mx_up' if self.round_up else 'mx'}:{self.block}"
        else:
            head = f"{self.kind}:{self.block}"
        opts = []
        if self.kind in ("block", "mx") and self.axis != -1:
            opts.append(f"axis={self.axis}")
        if self.pow2 and self.kind != "mx":
            opts.append("pow2")
        if self.margin:
            opts.append(f"margin={self.margin}")
        return ",".join([head, *opts])

    @property
    def cost_rank(self) -> int:
        """0 (per-tensor, cheapest) .. 4 (MX): the order of :data:`KINDS`.

        Cost means scale storage and scale work in a GEMM at the default sizes: one scale, one per
        row, one per 128x128 tile, one per 128 elements, one per 32 elements (MX also needs
        hardware block scaling).
        """
        return KINDS.index(self.kind)

    # ----------------------------------------------------------------- geometry
    def _axis(self, ndim: int) -> int:
        if not -ndim <= self.axis < ndim:
            raise ValueError(f"axis {self.axis} is out of range for a {ndim}-d array; "
                             f"valid: {-ndim}..{ndim - 1}" if ndim else
                             f"{self.kind} scaling needs an array of at least 1 dimension, got a 0-d one")
        return self.axis % ndim

    def block_shape(self, shape) -> tuple[int, ...]:
        """Extent of one scale block along each axis of an array of ``shape``.

        >>> Scaling.per_tile(128).block_shape((2, 300, 303))
        (1, 128, 128)
        """
        shape = tuple(int(d) for d in shape)
        nd = len(shape)
        if self.kind == "tensor":
            return tuple(max(d, 1) for d in shape)
        if self.kind == "tile":
            if nd < 2:
                raise ValueError(f"tile scaling needs an array of at least 2 dimensions, got shape {shape}")
            return (1,) * (nd - 2) + (self.block, self.block)
        a = self._axis(nd)
        out = [1] * nd
        out[a] = max(shape[a], 1) if self.kind == "channel" else self.block
        return tuple(out)

    def scale_shape(self, shape) -> tuple[int, ...]:
        """Shape of the scale array of a tensor of ``shape`` (same number of dimensions)."""
        shape = tuple(int(d) for d in shape)
        if self.kind == "tensor":
            return (1,) * len(shape)
        return tuple(-(-d // b) for d, b in zip(shape, self.block_shape(shape)))

    def check_format(self, fmt) -> Format:
        """The format, or ValueError when this recipe cannot apply to it."""
        f = get_format(fmt)
        if self.kind == "mx" and f.name not in MX_ELEMENT_FORMATS:
            raise ValueError(f"mx scaling applies to the OCP MX element formats "
                             f"{', '.join(MX_ELEMENT_FORMATS)}, not {f.name!r}; for power-of-two "
                             f"block scales use Scaling.per_block({self.block}, pow2=True)")
        return f

    @property
    def rule(self) -> int:
        if self.kind == "mx":
            return RULE_MX_UP if self.round_up else RULE_MX
        return RULE_POW2 if self.pow2 else RULE_AMAX


def _rule_params(f: Format) -> tuple[float, int]:
    """(target, emax_elem) of a format: the value amax maps to (``finfo.scale_target``: max, but
    15 for HiF8, the top of its 3-mantissa-bit region) and the largest finite value's binade
    (the OCP MX rule's emax_elem; MX applies to E4M3/E5M2 only, where the target is max)."""
    return float(f.finfo.scale_target), int(f.binades.e_max)


def compute_scale(amax, fmt, scaling: "Scaling | str | None" = None) -> np.ndarray:
    """The float32 scale(s) a recipe gives for block maxima ``amax`` (array_like, >= 0).

    The rules, with ``T`` the format's scale target (``finfo.scale_target``: its largest finite
    value, except HiF8: 15, the top of its 3-mantissa-bit region) and ``m`` the margin:

    * plain: ``s = fl32(amax / T * 2^m)`` (``amax`` maps to ``T``);
    * ``pow2``: ``s = 2^(k + m)`` with ``k`` the least integer such that ``amax <= T * 2^k``;
    * ``mx``: ``s = 2^(floor(log2 amax) - emax_elem + m)``; ``mx_up``: as ``pow2``.

    Every scale is then clamped to [2^-127, 2^127]. ``amax == 0`` gives ``s = 1`` (every element of
    such a block is zero and decodes exactly). ``amax`` NaN or negative raises ValueError; an
    infinite ``amax`` gives the largest scale.

    >>> compute_scale([448.0, 1.0, 0.0], "e4m3") == np.float32([1.0, 1 / 448, 1.0])
    array([ True,  True,  True])
    >>> compute_scale([448.0, 449.0, 1.0], "e4m3", "tensor,pow2").tolist()   # 1, 2, 2^-8
    [1.0, 2.0, 0.00390625]
    >>> compute_scale([1.0, 500.0], "e4m3", "mx").tolist()   # 2^(0 - 8), 2^(8 - 8)
    [0.00390625, 1.0]
    """
    from . import _scaling_kernels as SK

    sc = Scaling.per_tensor() if scaling is None else Scaling.parse(scaling)
    f = sc.check_format(fmt)
    a = np.asarray(amax, dtype=np.float64)
    if np.isnan(a).any() or (a < 0).any():
        raise ValueError("amax must be >= 0 and not NaN")
    fmax, emax = _rule_params(f)
    out = np.empty(a.shape, np.float32)
    SK.scales_from_amax(np.ascontiguousarray(a).reshape(-1), out.reshape(-1), fmax, np.int64(emax),
                        np.int64(sc.rule), np.int64(sc.margin))
    return out


class DelayedScaling:
    """Per-tensor delayed scaling: the scale comes from an amax history of earlier steps.

    Parameters
    ----------
    length : int
        Steps kept in the history (>= 1); the oldest is dropped first.
    algo : {"max", "most_recent"}
        Reduce the history by its maximum, or take the newest entry.
    margin : int
        As in :class:`Scaling`: headroom of ``2**margin``.
    pow2 : bool
        Power-of-two scales.

    The loop of a training step is: quantize with the scale from the history, then record the
    step's amax::

        qt = fp8lab.quantize(x, "e4m3", scaling=ds)   # does not change ds
        ds.update(x)

    Policy for special amax values (all tested):

    * an empty history (before the first update): the scale is computed from the tensor being
      quantized, as current scaling does;
    * ``update(x)`` records the maximum of ``|x|`` over its *finite* elements; NaN and +-Inf
      elements are left out (they still encode as NaN / overflow) and counted in
      :attr:`nonfinite_steps`; an x with no finite element records 0;
    * a reduced amax of 0 gives scale 1;
    * ``update_amax(a)`` with ``a`` NaN, infinite or negative raises ValueError.

    >>> import numpy as np
    >>> ds = DelayedScaling(length=3, algo="max")
    >>> for a in [1.0, 4.0, 2.0, 0.5]:
    ...     _ = ds.update_amax(a)
    >>> ds.history, ds.amax
    ((4.0, 2.0, 0.5), 4.0)
    >>> bool(ds.compute_scale("e4m3") == np.float32(4.0 / 448))
    True
    """

    ALGOS = ("max", "most_recent")

    def __init__(self, length: int = 16, algo: str = "max", *, margin: int = 0, pow2: bool = False):
        self.length = _check_int("length", length, minimum=1)
        if algo not in self.ALGOS:
            raise ValueError(f"unknown amax algo {algo!r}; known: {', '.join(self.ALGOS)}")
        self.algo = algo
        self.scaling = Scaling.per_tensor(pow2=pow2, margin=margin)
        self._history: deque = deque(maxlen=self.length)
        self.nonfinite_steps = 0

    @property
    def margin(self) -> int:
        return self.scaling.margin

    @property
    def pow2(self) -> bool:
        return self.scaling.pow2

    @property
    def history(self) -> tuple[float, ...]:
        """Recorded amax values, oldest first."""
        return tuple(self._history)

    @property
    def amax(self) -> float | None:
        """The reduced history (None while it is empty)."""
        if not self._history:
            return None
        return max(self._history) if self.algo == "max" else self._history[-1]

    def update_amax(self, amax) -> float:
        """Record one step's amax (a finite float >= 0); returns it."""
        a = float(amax)
        if not math.isfinite(a) or a < 0:
            raise ValueError(f"amax must be a finite float >= 0, got {amax!r}")
        self._history.append(a)
        return a

    def update(self, x) -> float:
        """Record ``max |x|`` over the finite elements of ``x``; returns the recorded amax."""
        from .qtensor import _float_input

        arr = _float_input(x)
        finite = np.isfinite(arr)
        if not finite.all():
            self.nonfinite_steps += 1
            arr = np.where(finite, arr, 0)
        a = float(np.max(np.abs(arr))) if arr.size else 0.0
        return self.update_amax(a)

    def compute_scale(self, fmt) -> np.float32 | None:
        """The scale from the history for format ``fmt`` (None while the history is empty)."""
        a = self.amax
        if a is None:
            return None
        return compute_scale(a, fmt, self.scaling)[()]

    def reset(self) -> None:
        self._history.clear()
        self.nonfinite_steps = 0

    def __repr__(self) -> str:
        return (f"DelayedScaling(length={self.length}, algo={self.algo!r}, margin={self.margin}, "
                f"pow2={self.pow2}, history={list(self._history)})")
