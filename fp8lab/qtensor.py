"""Scaled quantization: :func:`quantize` and the :class:`QTensor` it returns.

Convention: ``x ~= decode(qt.codes) * scale`` element-wise, each element using the scale of its
block (see :mod:`fp8lab.scaling` for the block layout of each recipe). Quantization is defined as::

    codes = fp8lab.encode(x.astype(float64) / broadcast(scales), fmt, rounding=..., saturate=...)

one float64 division and one rounding into the format. For float32, float16 and bfloat16 input this
equals rounding the exact quotient ``x / s`` (docs/scaling.md gives the argument), so the result is
the correctly rounded one. The fast path computes amax, scale and codes in one Numba pass.

>>> import numpy as np, fp8lab
>>> x = np.array([[1.0, -2.0, 3.0, 448.0], [0.5, 0.25, 0.0, -0.125]], np.float32)
>>> qt = fp8lab.quantize(x, "e4m3", scaling="channel,pow2")   # one scale per row
>>> qt.scales.tolist()                                        # 448 -> 448, 0.5 -> 448 * 2^-9
[[1.0], [0.001953125]]
>>> qt.dequantize().tolist()
[[1.0, -2.0, 3.0, 448.0], [0.5, 0.25, 0.0, -0.125]]
>>> qt.nbytes                       # 8 codes + 2 float32 scales
16
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from ._jit import PARALLEL_MIN
from .codecs import _as_float_array, _check_seed, _encoder_params, _lut, _seed_key, resolve_rounding
from .formats import Format, _float_dtype, get_format
from .scaling import DelayedScaling, Scaling, _rule_params

__all__ = ["QTensor", "quantize", "round_from_float64"]



class _LazyKernels:
    """The Numba kernel module, imported on first use (``import fp8lab`` stays light)."""

    def __getattr__(self, name):
        from . import _scaling_kernels
        return getattr(_scaling_kernels, name)


SK = _LazyKernels()
_ROW = 1 << 14  # row length of the synthetic 2-d view of per-tensor work
_ML_DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2",
              "e4m3fnuz": "float8_e4m3fnuz", "e5m2fnuz": "float8_e5m2fnuz"}
_FILE_VERSION = 1


def _float_input(x) -> np.ndarray:
    """x as a C-contiguous float32 or float64 array (float16 / bfloat16 widened exactly)."""
    arr = _as_float_array(x)
    if arr.dtype.name in ("float16", "bfloat16"):
        arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr).reshape(arr.shape)  # (ascontiguousarray makes 0-d 1-d)


def _geometry(shape, scaling: Scaling) -> tuple[int, int, int, int, int]:
    """(P, R, C, BR, BC): the tensor as a C-ordered (P, R, C) array cut in BR x BC blocks."""
    shape = tuple(shape)
    n = int(np.prod(shape)) if shape else 1
    bs = scaling.block_shape(shape)
    nd = len(shape)
    if scaling.kind == "tensor":
        return 1, 1, n, 1, max(n, 1)
    if scaling.kind == "tile":
        P = int(np.prod(shape[:-2]))
        return P, shape[-2], shape[-1], bs[-2], bs[-1]
    a = scaling._axis(nd)
    if a == nd - 1:
        return 1, int(np.prod(shape[:-1])), shape[-1], 1, bs[-1]
    return int(np.prod(shape[:a])), shape[a], int(np.prod(shape[a + 1:])), bs[a], 1


def _rows_view(n: int):
    """Split n elements into (rows of _ROW, tail) for per-tensor work in parallel."""
    main = n - n % _ROW
    return main // _ROW, main, n - main


def round_from_float64(x64: np.ndarray, dtype) -> np.ndarray:
    """Round float64 values once, to nearest-even, into float32, float16, bfloat16 or float64.

    float16 and bfloat16 go through float32 rounded *to odd*, which makes the two roundings equal
    to one (24 >= 11 + 2 and 24 >= 8 + 2 bits).
    """
    dt = _float_dtype(dtype)
    if dt == np.float64:
        return x64
    with np.errstate(over="ignore"):
        f = x64.astype(np.float32)
    if dt == np.float32:
        return f
    back = f.astype(np.float64)
    with np.errstate(invalid="ignore"):
        inexact = (back != x64) & ~np.isnan(x64)
        over = inexact & (np.abs(back) > np.abs(x64))
    bits = f.view(np.uint32)
    bits = np.where(over, bits - np.uint32(1), bits)
    bits = np.where(inexact, bits | np.uint32(1), bits)
    with np.errstate(over="ignore"):  # overflow to +-Inf is the correct rounding
        return bits.view(np.float32).astype(dt)


@dataclasses.dataclass(frozen=True, eq=False)
class QTensor:
    """A quantized tensor: 8-bit codes, float32 scales, format and recipe (validated, frozen).

    Attributes
    ----------
    codes : ndarray of uint8
        One code per element, the original shape, C-contiguous.
    scales : ndarray of float32
        Finite, > 0, of shape ``scaling.scale_shape(shape)`` (same number of dimensions as
        ``codes``); element ``i`` uses ``scales[i // scaling.block_shape(shape)]``.
    format : Format
    scaling : Scaling
    dtype : numpy.dtype
        The dtype of the tensor that was quantized (``dequantize`` defaults to float32).

    The arrays are read-only views. ``x ~= decode(codes) * scale``.
    """

    codes: np.ndarray
    scales: np.ndarray
    format: Format
    scaling: Scaling
    dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self):
        fmt = get_format(self.format)
        scaling = Scaling.parse(self.scaling)
        scaling.check_format(fmt)
        codes = self.codes
        if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8:
            got = codes.dtype.name if isinstance(codes, np.ndarray) else type(codes).__name__
            raise ValueError(f"codes must be a uint8 ndarray, got {got}")
        codes = np.ascontiguousarray(codes).reshape(codes.shape)  # a view; 0-d stays 0-d
        expected = scaling.scale_shape(codes.shape)
        scales = np.asarray(self.scales)
        if scales.dtype.kind != "f":
            raise ValueError(f"scales must be float32, got {scales.dtype.name}")
        if scales.shape != expected:
            raise ValueError(f"scales of shape {scales.shape} do not fit {scaling} scaling of a "
                             f"tensor of shape {codes.shape}: expected shape {expected}")
        s32 = np.ascontiguousarray(scales, dtype=np.float32).reshape(scales.shape)
        with np.errstate(invalid="ignore"):
            if scales.dtype != np.float32 and not np.array_equal(s32.astype(scales.dtype), scales,
                                                                 equal_nan=True):
                raise ValueError("scales must be exactly representable in float32")
            bad = ~(np.isfinite(s32) & (s32 > 0))
        if bad.any():
            raise ValueError(f"scales must be finite and > 0; got {s32[bad][:4].tolist()} "
                             f"at {int(bad.sum())} position(s)")
        if s32 is scales or s32.base is scales:
            s32 = s32.view()
        codes.setflags(write=False)
        s32.setflags(write=False)
        object.__setattr__(self, "codes", codes)
        object.__setattr__(self, "scales", s32)
        object.__setattr__(self, "format", fmt)
        object.__setattr__(self, "scaling", scaling)
        object.__setattr__(self, "dtype", _float_dtype(self.dtype))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape

    @property
    def ndim(self) -> int:
        return self.codes.ndim

    @property
    def size(self) -> int:
        return self.codes.size

    @property
    def nbytes(self) -> int:
        """Bytes of codes and scales."""
        return self.codes.nbytes + self.scales.nbytes

    def expanded_scales(self) -> np.ndarray:
        """The scale of every element, as a float32 array of ``shape``."""
        out = self.scales
        for ax, b in enumerate(self.scaling.block_shape(self.shape)):
            out = np.repeat(out, b, axis=ax)
        return np.ascontiguousarray(out[tuple(slice(0, d) for d in self.shape)])

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """``decode(codes) * scale`` (exact in float64), rounded once to ``dtype``.

        ``dtype``: float32 (default), float64 (exact), float16 or bfloat16 (nearest-even).
        """
        dt = _float_dtype(dtype)
        work = np.float32 if dt == np.float32 else np.float64
        table = self.format.decode_table("float64")
        out = np.empty(self.size, work)
        P, R, C, BR, BC = _geometry(self.shape, self.scaling)
        codes = self.codes.reshape(-1)
        scales = self.scales.reshape(-1)
        if self.scaling.kind == "tensor" and self.size >= PARALLEL_MIN:
            rows, main, tail = _rows_view(self.size)
            SK.dequantize_rows(codes[:main], 1, rows, _ROW, rows, _ROW, scales, table, out[:main])
            SK.dequantize_rows_serial(codes[main:], 1, 1, tail, 1, max(tail, 1), scales, table,
                                      out[main:])
        elif self.size:
            fn = SK.dequantize_rows if self.size >= PARALLEL_MIN else SK.dequantize_rows_serial
            fn(codes, P, R, C, BR, BC, scales, table, out)
        out = out.reshape(self.shape)
        return out if work == dt else round_from_float64(out, dt)

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write an ``.npz`` file (no pickled objects): codes, scales, format, recipe, dtype."""
        np.savez(path, codes=self.codes, scales=self.scales, format=np.str_(self.format.name),
                 scaling=np.str_(str(self.scaling)), dtype=np.str_(self.dtype.name),
                 version=np.int64(_FILE_VERSION))

    @classmethod
    def load(cls, path) -> "QTensor":
        """Read a file written by :meth:`save` (with ``allow_pickle=False``)."""
        with np.load(path, allow_pickle=False) as z:
            need = {"codes", "scales", "format", "scaling", "dtype", "version"}
            if not need <= set(z.files):
                raise ValueError(f"{os.fspath(path)!r} is not a QTensor file: it lacks "
                                 f"{sorted(need - set(z.files))}")
            if int(z["version"]) != _FILE_VERSION:
                raise ValueError(f"QTensor file version {int(z['version'])} is not supported "
                                 f"(this fp8lab reads version {_FILE_VERSION})")
            return cls(codes=z["codes"], scales=z["scales"], format=str(z["format"]),
                       scaling=str(z["scaling"]), dtype=str(z["dtype"]))

    def as_ml_dtypes(self) -> np.ndarray:
        """The codes as an ``ml_dtypes`` float8 array, sharing memory (read-only, no scales).

        e4m3 -> ``float8_e4m3fn``, e5m2 -> ``float8_e5m2`` (and the FNUZ formats -> their
        ``ml_dtypes`` twins); the element values are ``decode(codes)``, so
        ``view.astype(np.float32) * qt.expanded_scales()`` equals ``qt.dequantize()``.
        Formats ml_dtypes does not have (hif8) raise ValueError.
        """
        name = _ML_DTYPES.get(self.format.name)
        if name is None:
            raise ValueError(f"format {self.format.name!r} has no ml_dtypes equivalent; "
                             f"as_ml_dtypes supports {', '.join(_ML_DTYPES)}")
        return self.codes.view(_ml_dtype(self.format, name))

    def __repr__(self) -> str:
        return (f"QTensor(shape={self.shape}, format={self.format.name!r}, scaling='{self.scaling}', "
                f"dtype={self.dtype.name}, scales={self.scales.shape})")


@functools.lru_cache(maxsize=None)
def _ml_dtype(fmt: Format, name: str) -> np.dtype:
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, name))
    ours = fmt.decode_table("float64")
    theirs = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
    if not np.array_equal(ours, theirs, equal_nan=True):  # never expected: a declaration changed
        raise ValueError(f"ml_dtypes.{name} does not decode like fp8lab's {fmt.name}")
    return dt


def _resolve_scaling(scaling) -> Scaling | DelayedScaling:
    if scaling is None:
        return Scaling.per_tensor()
    if isinstance(scaling, (Scaling, DelayedScaling)):
        return scaling
    return Scaling.parse(scaling)


def _resolve_call(fmt, scaling, rounding, saturate, seed):
    """Validate quantize's arguments (shared by the CPU and GPU quantize).

    Returns (format, Scaling, DelayedScaling or None, rounding mode, saturate)."""
    f = get_format(fmt)
    sc = _resolve_scaling(scaling)
    delayed = sc if isinstance(sc, DelayedScaling) else None
    if delayed is not None:
        sc = delayed.scaling
    sc.check_format(f)
    mode = resolve_rounding(f, rounding)
    _check_seed(seed, mode)
    if saturate is None:
        saturate = sc.kind == "mx" and not sc.round_up
    if not isinstance(saturate, (bool, np.bool_)):
        raise ValueError(f"saturate must be a bool or None, got {saturate!r}")
    return f, sc, delayed, mode, bool(saturate)


def quantize(x, fmt, *, scaling=None, rounding=None, saturate=None, seed=None,
             scales=None) -> QTensor:
    """Quantize ``x`` into format ``fmt`` with a scaling recipe: ``x ~= decode(codes) * scale``.

    Parameters
    ----------
    x : array_like
        float64, float32, float16 or bfloat16 values of any shape and memory layout.
    fmt : str or Format
    scaling : Scaling, str, DelayedScaling or None
        The recipe (a string is read by :meth:`Scaling.parse`); None is per-tensor. A
        :class:`~fp8lab.scaling.DelayedScaling` gives a per-tensor scale from its amax history
        (it is not updated here: call ``ds.update(x)`` after).
    rounding : str, optional
        As :func:`fp8lab.encode` (None: the format's default).
    saturate : bool, optional
        Overflow to +-max instead of Inf/NaN. None (default) means False, except for the OCP MX
        rule (``Scaling.mx()`` without ``round_up``), whose specification clamps to max.
    seed : int, optional
        For ``rounding="stochastic"``: element ``i`` (C order) uses random bits of ``(seed, i)``.
    scales : array_like, optional
        Use these scales (float32, finite, > 0, of shape ``scaling.scale_shape(x.shape)``)
        instead of computing them from the data.

    Returns
    -------
    QTensor

    Scale rule (see :func:`fp8lab.scaling.compute_scale`): amax, the maximum of ``|x|`` over a
    block's *finite* elements, maps to the format's scale target, ``finfo(fmt).scale_target``
    (its max; 15 for HiF8) (``pow2``, ``mx``: a power of two).
    A block with no nonzero finite element gets scale 1. NaN elements encode as NaN, +-Inf as the
    format's overflow (Inf, NaN or +-max when saturating); neither affects the block's scale.
    """
    f, sc, delayed, mode, saturate = _resolve_call(fmt, scaling, rounding, saturate, seed)
    src = _as_float_array(x)
    src_dtype = src.dtype
    arr = _float_input(src)
    shape = arr.shape
    sshape = sc.scale_shape(shape)  # validates axis / ndim
    P, R, C, BR, BC = _geometry(shape, sc)
    if delayed is not None and scales is None:
        s = delayed.compute_scale(f)
        if s is not None:
            scales = np.full(sshape, s, np.float32)
    if scales is not None:
        scales = QTensor(np.zeros(shape, np.uint8), scales, f, sc).scales  # validates
        out_scales = np.array(scales, np.float32)
    else:
        out_scales = np.empty(sshape, np.float32)
    codes = np.empty(arr.size, np.uint8)
    flat = arr.reshape(-1)
    sflat = out_scales.reshape(-1)
    fmax, emax = _rule_params(f)
    sat = bool(saturate)
    table = _lut(f, "float32", mode, sat) if mode != "stochastic" else np.zeros(1, np.uint8)
    enc = (table, np.int64(_MODES[mode]), sat, *_encoder_params(f),
           _seed_key(seed) if mode == "stochastic" else np.uint64(0))
    big = arr.size >= PARALLEL_MIN
    if arr.size == 0:
        out_scales[...] = 1.0
    elif sc.kind == "tensor":
        if scales is None:
            amax = _amax_finite(flat)
            sflat[0] = SK.scale_of(amax, fmax, np.int64(emax), np.int64(sc.rule),
                                   np.int64(sc.margin))
        _encode_tensor(flat, sflat, codes, enc)
    elif scales is not None:
        (SK.encode_given if big else SK.encode_given_serial)(
            flat, P, R, C, BR, BC, sflat, codes, *enc, np.int64(0))
    else:
        rule = (fmax, np.int64(emax), np.int64(sc.rule), np.int64(sc.margin))
        nbR = -(-R // BR)
        bits = _bits(flat)
        if not big:
            SK.quantize_fused_serial(flat, *bits, P, R, C, BR, BC, *rule, sflat, codes, *enc,
                                     np.int64(0))
        elif P * nbR >= 2 * _threads():
            SK.quantize_fused(flat, *bits, P, R, C, BR, BC, *rule, sflat, codes, *enc, np.int64(0))
        else:  # few strips: amax per row in parallel, reduce, then encode rows in parallel
            nbC = -(-C // BC)
            partial = np.empty(P * R * nbC, np.float64)
            SK.row_amax(flat, *bits, P * R, C, BC, partial)
            amax = np.maximum.reduceat(partial.reshape(P, R, nbC), np.arange(0, R, BR), axis=1)
            SK.scales_from_amax(np.ascontiguousarray(amax).reshape(-1), sflat, *rule)
            SK.encode_given(flat, P, R, C, BR, BC, sflat, codes, *enc, np.int64(0))
    return QTensor(codes.reshape(shape), out_scales, f, sc, dtype=src_dtype)


def _threads() -> int:
    import numba

    return numba.get_num_threads()


def _bits(flat: np.ndarray) -> tuple:
    """(IEEE bits view, magnitude mask, +Inf bits) of a float32 or float64 array."""
    if flat.dtype == np.float32:
        return flat.view(np.uint32), np.uint32(0x7FFFFFFF), np.uint32(0x7F800000)
    return flat.view(np.uint64), np.uint64(0x7FFFFFFFFFFFFFFF), np.uint64(0x7FF0000000000000)


_MODES = {"nearest_even": 0, "nearest_away": 1, "toward_zero": 2, "stochastic": 3}


def _amax_finite(flat: np.ndarray) -> float:
    """max |x| over the finite elements (0.0 if none)."""
    if flat.size >= PARALLEL_MIN:
        rows, main, tail = _rows_view(flat.size)
        partial = np.empty(rows, np.float64)
        SK.row_amax(flat[:main], *_bits(flat[:main]), rows, _ROW, _ROW, partial)
        amax = float(partial.max()) if rows else 0.0
        rest = flat[main:]
    else:
        amax, rest = 0.0, flat
    if rest.size:
        a = np.abs(rest[np.isfinite(rest)])
        if a.size:
            amax = max(amax, float(a.max()))
    return amax


def _encode_tensor(flat, sflat, codes, enc) -> None:
    """Encode a flat array with one scale, in parallel rows of _ROW plus a serial tail."""
    n = flat.size
    if n >= PARALLEL_MIN:
        rows, main, tail = _rows_view(n)
        SK.encode_given(flat[:main], 1, rows, _ROW, rows, _ROW, sflat, codes[:main], *enc,
                        np.int64(0))
        if tail:
            SK.encode_given_serial(flat[main:], 1, 1, tail, 1, tail, sflat, codes[main:], *enc,
                                   np.int64(main))
    else:
        SK.encode_given_serial(flat, 1, 1, n, 1, n, sflat, codes, *enc, np.int64(0))

