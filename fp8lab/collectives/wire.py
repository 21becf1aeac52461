"""What goes on the wire: 8-bit codes with per-block float32 scales, and the arithmetic around it.

Every function here takes the array module ``xp`` (NumPy for the emulation, CuPy for the NCCL path)
and an encode/decode pair (:func:`fp8lab.encode` / :func:`fp8lab.gpu.encode` ...), and uses only
operations whose float32 results IEEE 754 fixes exactly: max of absolute values, float64 division
then rounding to float32, a float32 division, the (bit-identical) fp8lab codecs, a float32
multiply, a float32 add. Each is a separate array operation, so no fused multiply-add can form on
the GPU. That is why the emulation and the GPU path produce the same bits.

Quantizing a chunk ``v`` (float32) with block size ``B`` and format ``fmt`` (largest value ``M``)::

    amax[b]  = max |v[b*B : (b+1)*B]|                       exact
    scale[b] = fl32(amax[b] / M)   (pow2: 2^k, least k with amax <= M * 2^k); 1 if amax == 0;
               clamped to [2^-127, 2^127]
    code[i]  = encode(fl32(v[i] / scale[i // B]), fmt, rounding, saturate=True, seed)
    value[i] = fl32(decode(code[i]) * scale[i // B])

``saturate=True`` because ``fl32(amax / M)`` may round down so that ``amax / scale`` lies a hair
above ``M``; stochastic rounding could then round it up to overflow.

A message holding chunks ``c1 < c2 < ...`` is laid out as::

    [codes of c1, c2, ... (1 byte each)][0-3 zero bytes to a multiple of 4][scales (float32 LE)]

and its codes are encoded in one call, so stochastic rounding of element ``i`` of the message uses
the message seed and index ``i``.

>>> c = Compression("e4m3", block=32)
>>> c.message_nbytes([100, 28])      # 128 codes, 4 + 1 scales
148
>>> c.bytes_per_element
1.125
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from ..codecs import resolve_rounding
from ..formats import ROUNDING_MODES, get_format

__all__ = ["Compression", "derive_seed", "SCALE_MIN", "SCALE_MAX"]

SCALE_MIN = 2.0 ** -127
SCALE_MAX = 2.0 ** 127
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
PHASE_CODES = {"reduce": 0, "gather": 1}


def _mix64(z: int) -> int:
    """SplitMix64 finalizer on Python ints (the same function as fp8lab's stochastic rounding)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def derive_seed(seed: int, phase: str, rank: int, step: int) -> int:
    """The stochastic-rounding seed of the message ``rank`` sends at ``step`` of ``phase``.

    A pure function of its arguments (integer arithmetic only), so every process and both paths
    derive the same seed. The gather phase quantizes once per rank, with ``step = 0``.

    >>> derive_seed(7, "reduce", 1, 0) == derive_seed(7, "reduce", 1, 0) != derive_seed(7, "reduce", 0, 1)
    True
    """
    z = int(seed) & _MASK
    for v in (PHASE_CODES[phase], rank, step):
        z = _mix64((z + _GOLDEN * (int(v) + 1)) & _MASK)
    return z


@dataclasses.dataclass(frozen=True)
class Compression:
    """How each message is compressed (frozen, validated).

    Parameters
    ----------
    fmt : str
        Any registered format (``fp8lab.list_formats()``): e4m3, e5m2, hif8, ...
    block : int
        Elements per float32 scale (>= 1). Blocks start at chunk boundaries.
    rounding : {None, "nearest_even", "nearest_away", "toward_zero", "stochastic"}
        ``None`` is the format's default nearest mode.
    seed : int, optional
        Required by (and only by) ``stochastic``: the collective's base seed; message seeds come
        from :func:`derive_seed`.
    pow2 : bool
        Power-of-two scales (exact scaling; up to one binade of the format's range unused).
    """

    fmt: str = "e4m3"
    block: int = 128
    rounding: str | None = None
    seed: int | None = None
    pow2: bool = False

    def __post_init__(self):
        f = get_format(self.fmt)
        object.__setattr__(self, "fmt", f.name)
        if isinstance(self.block, bool) or not isinstance(self.block, numbers.Integral) or self.block < 1:
            raise ValueError(f"block must be an int >= 1, got {self.block!r}")
        object.__setattr__(self, "block", int(self.block))
        mode = resolve_rounding(f, self.rounding)
        object.__setattr__(self, "rounding", mode)
        if mode == "stochastic":
            if self.seed is None:
                raise ValueError("rounding='stochastic' needs seed= (an int in 0..2**64-1)")
            if (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)
                    or not 0 <= self.seed < 1 << 64):
                raise ValueError(f"seed must be an int in 0..2**64-1, got {self.seed!r}")
        elif self.seed is not None:
            raise ValueError(f"seed= is only used by rounding='stochastic' (rounding is {mode!r}; "
                             f"known modes: {', '.join(ROUNDING_MODES)})")
        if not isinstance(self.pow2, (bool, np.bool_)):
            raise ValueError(f"pow2 must be a bool, got {self.pow2!r}")

    @property
    def format(self):
        return get_format(self.fmt)

    @property
    def stochastic(self) -> bool:
        return self.rounding == "stochastic"

    def nblocks(self, size: int) -> int:
        return -(-int(size) // self.block)

    def message_nbytes(self, chunk_sizes) -> int:
        """Bytes of one message carrying chunks of these sizes (codes, padding, scales)."""
        n = sum(int(s) for s in chunk_sizes)
        nb = sum(self.nblocks(s) for s in chunk_sizes)
        return -(-n // 4) * 4 + 4 * nb if nb else n

    @property
    def bytes_per_element(self) -> float:
        """Wire bytes per element of a long chunk: 1 + 4 / block."""
        return 1.0 + 4.0 / self.block

    def message_seed(self, phase: str, rank: int, step: int) -> int | None:
        return derive_seed(self.seed, phase, rank, step) if self.stochastic else None


# ---------------------------------------------------------------------- xp-generic arithmetic
def block_scales(xp, v, comp: Compression):
    """float32 scales of the blocks of chunk ``v`` (float32, 1-D)."""
    B = comp.block
    nb = comp.nblocks(v.size)
    a = xp.abs(v)
    pad = nb * B - v.size
    if pad:
        a = xp.concatenate([a, xp.zeros(pad, dtype=xp.float32)])
    amax = a.reshape(nb, B).max(axis=1)  # exact
    fmax = float(comp.format.finfo.scale_target)  # amax maps here (15 for HiF8, else max)
    if comp.pow2:
        # least k with amax <= M * 2^k, in integer arithmetic on (mantissa, exponent) pairs:
        # amax = m * 2^e, M = mf * 2^ef with m, mf in [0.5, 1)
        m, e = xp.frexp(amax.astype(xp.float64))
        mf, ef = math.frexp(fmax)
        k = e.astype(xp.int64) - ef + (m > mf).astype(xp.int64)
        k = xp.clip(k, -127, 127).astype(xp.int32)
        s = xp.ldexp(xp.ones(nb, dtype=xp.float32), k).astype(xp.float32)
    else:
        s = (amax.astype(xp.float64) / fmax).astype(xp.float32)
        s = xp.clip(s, xp.float32(SCALE_MIN), xp.float32(SCALE_MAX)).astype(xp.float32)
    return xp.where(amax == 0, xp.float32(1.0), s).astype(xp.float32)


def expand(xp, scales, size: int, block: int):
    """Per-element scales of a chunk of ``size`` elements."""
    return xp.repeat(scales, block)[:size]


def quantize_message(xp, encode, vs, comp: Compression, seed):
    """Quantize chunks ``vs`` (float32 1-D arrays) into one packed uint8 message."""
    scales = [block_scales(xp, v, comp) for v in vs]
    scaled = [v / expand(xp, s, v.size, comp.block) for v, s in zip(vs, scales)]
    t = xp.concatenate(scaled) if len(scaled) > 1 else scaled[0]
    codes = encode(t, comp.fmt, rounding=comp.rounding, saturate=True, seed=seed)
    return pack(xp, codes, xp.concatenate(scales) if len(scales) > 1 else scales[0])


def pack(xp, codes, scales):
    n = codes.size
    off = -(-n // 4) * 4 if scales.size else n
    buf = xp.zeros(off + 4 * scales.size, dtype=xp.uint8)
    buf[:n] = codes
    if scales.size:
        buf[off:] = scales.astype(xp.float32).view(xp.uint8)
    return buf


def unpack(xp, buf, sizes, block: int):
    """Split a message into per-chunk ``(codes, scales)`` pairs (views of ``buf``)."""
    n = sum(sizes)
    nbs = [-(-s // block) for s in sizes]
    off = -(-n // 4) * 4 if sum(nbs) else n
    scales = buf[off:off + 4 * sum(nbs)].view(xp.float32)
    out, i, j = [], 0, 0
    for s, nb in zip(sizes, nbs):
        out.append((buf[i:i + s], scales[j:j + nb]))
        i += s
        j += nb
    return out


def dequantize(xp, decode, codes, scales, comp: Compression):
    """float32 values of one chunk's codes and scales: fl32(decode(code) * scale)."""
    d = decode(codes, comp.fmt, dtype="float32")
    return d * expand(xp, scales, codes.size, comp.block)
