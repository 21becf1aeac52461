"""Public CPU codecs: :func:`encode` (floats -> uint8 codes) and :func:`decode` (codes -> floats).

Both are bit-exact: :func:`encode` equals :func:`fp8lab.reference.encode_value` on every input
(tested exhaustively on all float16 and bfloat16 inputs in CI, and on all 2^32 float32 inputs by
``python -m fp8lab.conformance``), and :func:`decode` gives each code's exact value.

>>> import numpy as np, fp8lab
>>> codes = fp8lab.encode(np.array([1.0, 1.0625, -431.99999999999994, 1e6]), "e4m3")
>>> [hex(c) for c in codes]
['0x38', '0x38', '0xfd', '0x7f']
>>> fp8lab.decode(codes, "e4m3")
array([   1.,    1., -416.,   nan], dtype=float32)
>>> fp8lab.encode(1e6, "e4m3", saturate=True), fp8lab.encode([15.5], "hif8")
(array(126, dtype=uint8), array([64], dtype=uint8))
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from ._jit import PARALLEL_MIN
from .formats import ROUNDING_MODES, Format, _float_dtype, get_format

__all__ = ["encode", "decode", "resolve_rounding"]


class _LazyKernels:
    """The Numba kernel module, imported on first use (importing Numba costs ~0.4 s)."""

    def __getattr__(self, name):
        from . import _kernels
        return getattr(_kernels, name)


K = _LazyKernels()

_ACCEPTED = "float64, float32, float16 or bfloat16"
# (bits dtype, width W, significand bits P, exponent bias) of the generic encoder's inputs
_IEEE = {"float32": (np.uint32, 32, 24, 127), "float64": (np.int64, 64, 53, 1023)}


def resolve_rounding(fmt: Format, rounding) -> str:
    """The rounding mode a call means: ``None`` is the format's default."""
    if rounding is None:
        return fmt.default_rounding
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding mode {rounding!r}; known: {', '.join(ROUNDING_MODES)}")
    return rounding


def _as_float_array(x) -> np.ndarray:
    """``x`` as a float ndarray, refusing what would be silently cast."""
    if isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, (bool, np.bool_)) or isinstance(x, (str, bytes)):
        raise TypeError(f"cannot encode {type(x).__name__} {x!r}; accepted: {_ACCEPTED}")
    elif isinstance(x, float):
        arr = np.asarray(x, dtype=np.float64)
    elif isinstance(x, numbers.Integral) or isinstance(x, numbers.Complex) and not isinstance(x, np.floating):
        raise TypeError(f"cannot encode {type(x).__name__} {x!r}: convert it to a float type first "
                        f"(accepted: {_ACCEPTED})")
    else:
        arr = np.asarray(x)
    kind = arr.dtype.name
    if kind in ("float16", "float32", "float64", "bfloat16"):
        if not arr.dtype.isnative:  # the kernels read native-endian bits: convert (exactly)
            arr = arr.astype(arr.dtype.newbyteorder("="))
        return arr
    if arr.dtype == np.longdouble:
        raise TypeError(f"{kind} input is refused (it would be rounded silently); convert it to "
                        f"float64 explicitly. Accepted: {_ACCEPTED}")
    raise TypeError(f"cannot encode an array of {kind}; accepted: {_ACCEPTED}")


def _codes_array(codes) -> np.ndarray:
    arr = codes if isinstance(codes, np.ndarray) else np.asarray(codes)
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype.kind in "iu":
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ValueError("codes must lie in 0..255")
        return arr.astype(np.uint8)
    raise TypeError(f"codes must be uint8 (or integers in 0..255), not {arr.dtype.name}")


@functools.lru_cache(maxsize=None)
def _encoder_params(fmt: Format) -> tuple:
    b = fmt.binades
    codes = np.empty(7, np.int64)
    codes[K.C_MAX] = fmt.max_code
    codes[K.C_ZERO_POS] = fmt.zero_codes[0]
    codes[K.C_ZERO_NEG] = fmt.zero_codes[-1]
    codes[K.C_NAN_POS], codes[K.C_NAN_NEG] = fmt.nan_encode
    codes[K.C_OVF_POS], codes[K.C_OVF_NEG] = fmt.inf_codes or fmt.nan_encode
    for a in (codes, b.mbits, b.base):
        a.setflags(write=False)
    return (np.int64(b.e_low), np.int64(b.e_max), np.int64(b.top_count), b.mbits, b.base, codes)


def _seed_key(seed) -> np.uint64:
    return np.uint64(int(K.mix64(np.uint64((int(seed) + 0x9E3779B97F4A7C15) % (1 << 64)))))


def _encode_bits(bits: np.ndarray, kind: str, fmt: Format, mode: str, sat: bool, seed=None,
                 out: np.ndarray | None = None) -> np.ndarray:
    """Generic encoder over a flat array of IEEE bits (``kind`` float32 or float64)."""
    _, W, P, bias = _IEEE[kind]
    if out is None:
        out = np.empty(bits.size, np.uint8)
    key = _seed_key(seed) if mode == "stochastic" else np.uint64(0)
    fn = K.encode_bits_parallel if bits.size >= PARALLEL_MIN else K.encode_bits_serial
    fn(bits, out, np.int64(W), np.int64(P), np.int64(bias), np.int64(K.MODE_CODES[mode]),
       bool(sat), *_encoder_params(fmt), key, np.int64(0))
    return out


@functools.lru_cache(maxsize=None)
def _lut(fmt: Format, kind: str, mode: str, sat: bool) -> np.ndarray:
    """Encode table for a deterministic mode: 2^17 entries for float32, 2^16 for 16-bit floats."""
    if kind == "float32":
        k = np.arange(1 << 17, dtype=np.uint32)
        bits = ((k >> 1) << 16) | (k & 1)
    elif kind == "bfloat16":
        bits = np.arange(1 << 16, dtype=np.uint32) << 16
    else:  # float16: exact in float32
        bits = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    table = _encode_bits(bits, "float32", fmt, mode, sat)
    table.setflags(write=False)
    return table


def _check_seed(seed, mode: str):
    if mode == "stochastic":
        if seed is None:
            raise ValueError("rounding='stochastic' needs seed= (an int in 0..2**64-1)")
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 1 << 64:
            raise ValueError(f"seed must be an int in 0..2**64-1, got {seed!r}")
    elif seed is not None:
        raise ValueError(f"seed= is only used by rounding='stochastic' (rounding is {mode!r})")


def encode(x, fmt, *, rounding=None, saturate=False, seed=None, via_float32=False) -> np.ndarray:
    """Encode floats into 8-bit codes of format ``fmt``.

    Parameters
    ----------
    x : array_like
        float64, float32, float16 or bfloat16 (``ml_dtypes.bfloat16``) values: an ndarray of any
        shape and memory layout, a NumPy scalar, a Python float or a list of floats. Integer,
        complex, bool, string, object and extended-precision inputs raise ``TypeError``.
    fmt : str or Format
        Format name or alias (see :func:`fp8lab.list_formats`).
    rounding : {None, "nearest_even", "nearest_away", "toward_zero", "stochastic"}
        ``None`` is the format's default (``nearest_even``; ``nearest_away`` for HiF8).
    saturate : bool
        Finite overflow and +-Inf go to +-max instead of Inf (or NaN where the format has no Inf).
        NaN stays NaN.
    seed : int, optional
        Required by (and only by) ``stochastic``. Element ``i`` (C order) is rounded with random
        bits that depend only on ``(seed, i)``.
    via_float32 : bool
        Round float64 input to float32 first (nearest-even), reproducing ml_dtypes and torch,
        which round twice. The default rounds float64 once, correctly.

    Returns
    -------
    numpy.ndarray of uint8, C-contiguous, with ``x``'s shape.
    """
    if type(x).__module__.startswith("cupy"):  # CuPy array: the GPU codecs (same results)
        from .gpu import codecs as gpu_codecs
        return gpu_codecs.encode(x, fmt, rounding=rounding, saturate=saturate, seed=seed,
                                 via_float32=via_float32)
    f = get_format(fmt)
    mode = resolve_rounding(f, rounding)
    _check_seed(seed, mode)
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    arr = _as_float_array(x)
    kind = arr.dtype.name
    if kind == "float64" and via_float32:
        arr, kind = arr.astype(np.float32), "float32"
    flat = np.ascontiguousarray(arr).reshape(-1)
    out = np.empty(flat.size, np.uint8)
    if mode != "stochastic" and kind != "float64":
        table = _lut(f, kind, mode, bool(saturate))
        if kind == "float32":
            fn = K.lut32_parallel if flat.size >= PARALLEL_MIN else K.lut32_serial
            fn(flat.view(np.uint32), table, out)
        else:
            fn = K.lookup_parallel if flat.size >= PARALLEL_MIN else K.lookup_serial
            fn(flat.view(np.uint16), table, out)
    else:
        if kind in ("float16", "bfloat16"):
            flat, kind = flat.astype(np.float32), "float32"
        _encode_bits(flat.view(_IEEE[kind][0]), kind, f, mode, bool(saturate), seed, out)
    return out.reshape(arr.shape)


def decode(codes, fmt, *, dtype=np.float32) -> np.ndarray:
    """Decode 8-bit codes of format ``fmt`` into floats of ``dtype`` (all exact).

    ``dtype``: float16, bfloat16 (needs ``ml_dtypes``), float32 or float64. Every value of every
    fp8lab format is exact in each of them. NaN codes give a quiet NaN (compare with ``isnan``).
    """
    if type(codes).__module__.startswith("cupy"):  # CuPy array: the GPU codecs
        from .gpu import codecs as gpu_codecs
        return gpu_codecs.decode(codes, fmt, dtype=dtype)
    f = get_format(fmt)
    dt = _float_dtype(dtype)
    arr = _codes_array(codes)
    flat = np.ascontiguousarray(arr).reshape(-1)
    table = f.decode_table(dt.name if dt.name != "bfloat16" else "bfloat16")
    if dt.itemsize == 2:
        table = table.view(np.uint16)
    out = np.empty(flat.size, table.dtype)
    fn = K.lookup_parallel if flat.size >= PARALLEL_MIN else K.lookup_serial
    fn(flat, table, out)
    return out.view(dt).reshape(arr.shape)
