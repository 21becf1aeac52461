"""GPU codecs for CuPy arrays: the same results as :func:`fp8lab.encode` / :func:`fp8lab.decode`.

Bit-identical to the CPU: same rounding modes (stochastic included: element ``i`` of the C-order
flattened array draws the same SplitMix64 bits from the same ``seed``), same saturate policy, same
special codes. Checked on an H200 over all 2^32 float32 inputs for every format and deterministic
mode (``benchmarks/gpu_check.py``; results in ``docs/gpu.md``).

Inputs: CuPy arrays of float32, float64 or float16, or bfloat16 passed as its uint16 bit pattern
with ``bfloat16=True`` (CuPy has no bfloat16 dtype); any object exporting DLPack is taken through
``cupy.from_dlpack``. Outputs: CuPy uint8 codes, C-contiguous, the input's shape.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import _kernels as K
from ..codecs import _check_seed, _lut, _seed_key, resolve_rounding
from ..formats import get_format
from . import _loader

__all__ = ["encode", "decode"]

_KIND = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
_THREADS = 512
#: float16/bfloat16 (and float32 with path="bits"/"lut") deterministic modes: "bits" (integer
#: logic, tables of a few dozen bytes) or "lut" (the CPU's 2^17-entry table in shared memory).
#: Both are proven equal on all 2^32 inputs.
FLOAT32_PATH = "lut"
#: launch shapes of the v3 kernels (benchmarks/gpu_codecs_v3.py sweeps them; see docs/gpu.md):
#: float32 table encode fp8_encode_lut32, the float32 default outside E4M3/E5M2 nearest even:
#: (UNR groups of 4 per thread, half table, threads, blocks per SM (0: one block per UNR *
#: threads groups), streaming cache hints[, table read from global memory]).
ENCODE_LUT32 = (4, False, 512, 0, False, True)
#: decode, per output size: (UNR words of codes per thread, replicated table, threads, blocks per
#: SM). H200 2026-12-02: (8, False, 512, 4) 0.878-0.880 of copy to float32, 0.873 to float16
#: (batched); the replicated table did not help (0.861-0.870 at the same shape).
DECODE_CFG = {2: (8, False, 512, 4), 4: (8, False, 512, 4), 8: (4, False, 512, 4)}
_cache: dict = {}


def _cupy():
    import cupy
    return cupy


def _as_cupy(x):
    cp = _cupy()
    if isinstance(x, cp.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return cp.from_dlpack(x)
    raise TypeError(f"fp8lab.gpu expects a CuPy array (or a DLPack-exporting device array), "
                    f"got {type(x).__name__}; use fp8lab.encode / fp8lab.decode for NumPy arrays")


def _widen_float16(x, xp):
    """A float16 array as a new C-ordered float32 array, exactly, every NaN keeping its sign.

    ``xp`` is the array module (CuPy, or NumPy for a host check). On the device a half-to-float
    conversion (``cvt.f32.f16``, which CuPy's ``astype`` compiles to) returns a NaN without its
    sign, while the codes of E4M3 and E5M2 keep a NaN's sign (``docs/codecs.md``, NaN inputs), so
    the sign bit is put back from the input's bits. For every other value it is already there.
    """
    y = xp.ascontiguousarray(x, dtype=xp.float32)
    bits = y.view(xp.uint32)
    sign = (x.view(xp.uint16) >> 15).astype(xp.uint32) << 31
    xp.bitwise_or(bits, sign, out=bits)
    return y


# CuPy compiles its own elementwise and reduction kernels with -ftz=true, so any float32
# arithmetic, comparison or widening in them reads a subnormal as zero. The helpers below touch
# float32 values only through their bits (and float64 arithmetic, which -ftz leaves alone).
_F32_PREAMBLE = r"""
__device__ double fp8lab_widen(unsigned int u) {   // float32 bits -> the same value as float64
    const unsigned int m = u & 0x7fffffffu, e = m >> 23;
    const unsigned long long sign = (unsigned long long)(u >> 31) << 63;
    if (e == 0)   // zero or subnormal: m units of 2^-149, exactly
        return __longlong_as_double(__double_as_longlong((double)m * 1.401298464324817e-45) | sign);
    const unsigned long long ex = e == 255 ? 2047ull : (unsigned long long)(e + 896);
    return __longlong_as_double((long long)(sign | ex << 52 | (unsigned long long)(m & 0x7fffffu) << 29));
}
__device__ double fp8lab_finite_abs(float x) {
    const unsigned int m = __float_as_uint(x) & 0x7fffffffu;
    return m >= 0x7f800000u ? 0.0 : fp8lab_widen(m);
}
__device__ double fp8lab_finite_abs(double x) { return isfinite(x) ? fabs(x) : 0.0; }
"""


@functools.lru_cache(maxsize=None)
def _widen_kernel():
    cp = _cupy()
    return cp.ElementwiseKernel("uint32 u", "float64 y", "y = fp8lab_widen(u)", "fp8lab_widen_f32",
                                preamble=_F32_PREAMBLE)


def _widen_float32(x, cp):
    """A float32 CuPy array as float64, exactly, subnormals included (``astype`` flushes them)."""
    return _widen_kernel()(cp.ascontiguousarray(x).view(cp.uint32))


def _positive_finite(s, cp):
    """Elementwise ``isfinite(s) & (s > 0)`` for float32 ``s``, on the bits (a subnormal counts)."""
    bits = cp.ascontiguousarray(s).view(cp.int32)
    return (bits > 0) & (bits < 0x7F800000)


def _sm_count() -> int:
    cp = _cupy()
    dev = cp.cuda.Device().id
    key = ("sms", dev)
    if key not in _cache:
        _cache[key] = cp.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"]
    return _cache[key]


def _grid(nwork: int, threads: int, per_sm: int) -> int:
    return max(1, min((nwork + threads - 1) // threads, _sm_count() * per_sm))


def _device_table(key, make):
    cp = _cupy()
    k = (cp.cuda.Device().id,) + key
    t = _cache.get(k)
    if t is None:
        t = _cache[k] = cp.asarray(make())
    return t


def encode_instance(kind: str, mode: str, sat: bool, use_lut: bool) -> str:
    return (f"fp8_encode<{_KIND[kind]}, {K.MODE_CODES[mode]}, {'true' if sat else 'false'}, "
            f"{'true' if use_lut else 'false'}>")


def encode_lut32_instance(unr: int, half: bool, cs: bool = True, glob: bool = False) -> str:
    b = lambda v: "true" if v else "false"
    return f"fp8_encode_lut32<{unr}, {b(half)}, {b(cs)}, {b(glob)}>"


def encode_cvt_instance(fmt: str, sat: bool, unr: int, cs: bool = True) -> str:
    return (f"fp8_encode_cvt<{'true' if fmt == 'e5m2' else 'false'}, {'true' if sat else 'false'}, "
            f"{unr}, {'true' if cs else 'false'}>")


def decode_v3_instance(nbytes: int, unr: int, repl: bool) -> str:
    return f"fp8_decode_v3<{nbytes}, {unr}, {'true' if repl else 'false'}>"


#: every (UNR, half) / (nbytes, UNR, repl) that the sweep of benchmarks/gpu_check.py may launch
_LUT32_VARIANTS = [(u, h, c, g) for u in (2, 4, 8) for h in (False, True) for c in (False, True)
                   for g in (False, True) if not (h and g) and (u != 2 or g)]
#: formats with a hardware conversion (sm_89+: cvt.rn.satfinite.{e4m3,e5m2}x2.f32), nearest even
CVT_FORMATS = ("e4m3", "e5m2")
_CVT_UNR = (2, 4, 8)
_DECODE_VARIANTS = [(b, u, r) for b in (2, 4, 8) for u in (4, 8) for r in (False, True) if not (r and b == 8)]


def _half_lut(f, mode: str, sat: bool):
    """The positive half of the CPU float32 table plus the 256-entry map from a positive result
    code to the code of the negated input, or None when encode(-x) is not a function of
    encode(x) for this format and mode (then a 1-byte marker: the full table is used)."""
    full = np.asarray(_lut(f, "float32", mode, sat))
    pos, neg = full[: 1 << 16], full[1 << 16:]
    m = np.arange(256, dtype=np.uint8)
    m[pos] = neg
    if not np.array_equal(m[pos], neg):
        return np.zeros(1, np.uint8)
    return np.concatenate([pos, m]).astype(np.uint8)


def _instances() -> list[str]:
    """Every template instance the library launches from codecs.cu (for the nvcc build check)."""
    out = [encode_instance(k, m, s, False) for k in _KIND for m in K.MODE_CODES for s in (False, True)]
    out += [encode_instance("float32", m, s, True) for m in K.MODE_CODES if m != "stochastic"
            for s in (False, True)]
    out += [encode_lut32_instance(u, h, c, g) for u, h, c, g in _LUT32_VARIANTS]
    out += [encode_cvt_instance(f, s, u, c) for f in CVT_FORMATS for s in (False, True)
            for u in _CVT_UNR for c in (False, True)]
    out += [decode_v3_instance(b, u, r) for b, u, r in _DECODE_VARIANTS]
    return out


def encode(x, fmt, *, rounding=None, saturate=False, seed=None, via_float32=False, bfloat16=False,
           path=None):
    """Encode a CuPy array into 8-bit codes of ``fmt`` (see :func:`fp8lab.encode`).

    ``bfloat16=True`` reads a uint16 array as bfloat16 bit patterns. Float32 input in a
    deterministic mode runs ``fp8_encode_cvt`` (E4M3/E5M2, nearest even: the hardware
    conversion) or ``fp8_encode_lut32`` (the CPU's float32 table), both checked on all 2^32
    inputs on an H200. ``path`` forces a kernel: "bits" (integer logic) or "lut" (the table,
    ``fp8_encode``) for float32/float16/bfloat16, "lut32" or "cvt" for float32.
    """
    cp = _cupy()
    f = get_format(fmt)
    mode = resolve_rounding(f, rounding)
    _check_seed(seed, mode)
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool, got {type(saturate).__name__}")
    x = _as_cupy(x)
    if bfloat16:
        if x.dtype != cp.uint16:
            raise TypeError(f"bfloat16=True needs the uint16 bit patterns, got {x.dtype}")
        kind = "bfloat16"
    else:
        kind = x.dtype.name
        if kind not in ("float32", "float64", "float16"):
            hint = " (pass bfloat16 bits with bfloat16=True)" if kind == "uint16" else ""
            raise TypeError(f"cannot encode a CuPy array of {kind}; accepted: float32, float64, "
                            f"float16, bfloat16 bits{hint}")
    if kind == "float64" and via_float32:
        x, kind = x.astype(cp.float32), "float32"
    flat = cp.ascontiguousarray(x).reshape(-1)
    n = flat.size
    out = cp.empty(n, cp.uint8)
    if n == 0:
        return out.reshape(x.shape)
    if path not in (None, "bits", "lut", "lut32", "cvt"):
        raise ValueError(f"unknown path {path!r}; known: bits, lut, lut32, cvt")
    if path == "cvt":
        if not (kind == "float32" and mode == "nearest_even" and f.name in CVT_FORMATS):
            raise ValueError(f"path='cvt' needs float32 input, rounding='nearest_even' and a format "
                             f"in {CVT_FORMATS}; got {kind}, {mode!r}, {f.name!r}")
        _encode_cvt(flat, out, f, bool(saturate))
        return out.reshape(x.shape)
    if path is None and kind == "float32" and mode != "stochastic":
        if mode == "nearest_even" and f.name in CVT_FORMATS:
            _encode_cvt(flat, out, f, bool(saturate))
        else:
            _encode_lut32(flat, out, f, mode, bool(saturate))
        return out.reshape(x.shape)
    use_lut = (path or FLOAT32_PATH) in ("lut", "lut32") and mode != "stochastic" and kind != "float64"
    if use_lut and kind == "float32" and path == "lut32":
        _encode_lut32(flat, out, f, mode, bool(saturate))
        return out.reshape(x.shape)
    k = _loader.kernel("codecs.cu", encode_instance(kind, mode, bool(saturate), use_lut),
                       _loader.format_defines(f))
    key = np.uint64(_seed_key(seed)) if mode == "stochastic" else np.uint64(0)
    vec = int(flat.data.ptr % 16 == 0 and out.data.ptr % 16 == 0)
    if use_lut:
        lut = _device_table(("lut", f.name, mode, bool(saturate)),
                            lambda: _lut(f, "float32", mode, bool(saturate)))
        smem = 1 << 17
        k.max_dynamic_shared_size_bytes = smem
        threads, per_sm = 1024, 1
    else:
        lut, smem, threads, per_sm = out, 0, _THREADS, 4
    grid = max(1, min(n // (16 * threads), _sm_count() * per_sm))
    k((grid,), (threads,), (flat, out, np.int64(n), np.int32(vec), key, lut), shared_mem=smem)
    return out.reshape(x.shape)


def _encode_lut32(flat, out, f, mode: str, sat: bool, cfg=None):
    """float32 deterministic encode through the CPU table (fp8_encode_lut32, codecs.cu)."""
    unr, half, threads, per_sm, cs = cfg[:5] if cfg else ENCODE_LUT32[:5]
    glob = bool((cfg or ENCODE_LUT32)[5:6] and (cfg or ENCODE_LUT32)[5])
    lut = None
    if half:
        lut = _device_table(("lut32h", f.name, mode, sat), lambda: _half_lut(f, mode, sat))
        if lut.size == 1:   # marker: no sign map for this format and mode
            lut, half = None, False
    if lut is None:
        lut = _device_table(("lut", f.name, mode, sat), lambda: _lut(f, "float32", mode, sat))
    k = _loader.kernel("codecs.cu", encode_lut32_instance(unr, half, cs, glob), _loader.format_defines(f))
    smem = 0 if glob else (1 << 16) + 256 if half else 1 << 17
    if k.max_dynamic_shared_size_bytes < smem:
        k.max_dynamic_shared_size_bytes = smem
    n = flat.size
    vec = int(flat.data.ptr % 16 == 0 and out.data.ptr % 16 == 0)
    grid = max(1, -(-n // (4 * unr * threads)))
    if per_sm:
        grid = min(grid, _sm_count() * per_sm)
    k((grid,), (threads,), (flat, out, np.int64(n), np.int32(vec), lut), shared_mem=smem)


def cvt_special(f, sat: bool) -> int:
    """Smallest float32 magnitude (bits) that fp8_encode_cvt routes to the generic encoder.

    With ``sat``: NaN only (cvt's SATFINITE already maps overflow and +-Inf to +-max). Without:
    also the first magnitude whose nearest-even code is the overflow code (NaN for E4M3, Inf for
    E5M2), read off the CPU's float32 table (entry 2 * hi16 + sticky).
    """
    if sat:
        return 0x7F800001
    lut = np.asarray(_lut(f, "float32", "nearest_even", False))[: 1 << 16]
    ovf = int(np.asarray(lut)[2 * (0x7F800000 >> 16)])   # +Inf's code: the overflow code
    i = int(np.flatnonzero(lut == ovf)[0])
    return ((i >> 1) << 16) | (i & 1)


#: fp8_encode_cvt launch shape: (UNR groups of 4 per thread, threads, blocks per SM or 0 for one
#: block per UNR * threads groups (no grid-stride), streaming cache hints)
ENCODE_CVT = (2, 512, 0, False)


def _encode_cvt(flat, out, f, sat: bool, cfg=None):
    """float32 -> e4m3 / e5m2, nearest even, through the hardware conversion (fp8_encode_cvt)."""
    unr, threads, per_sm, cs = cfg or ENCODE_CVT
    k = _loader.kernel("codecs.cu", encode_cvt_instance(f.name, sat, unr, cs), _loader.format_defines(f))
    key = ("cvt_special", f.name, sat)
    if key not in _cache:
        _cache[key] = cvt_special(f, sat)
    n = flat.size
    vec = int(flat.data.ptr % 16 == 0 and out.data.ptr % 16 == 0)
    grid = max(1, -(-n // (4 * unr * threads)))
    if per_sm:
        grid = min(grid, _sm_count() * per_sm)
    k((grid,), (threads,), (flat, out, np.int64(n), np.int32(vec), np.uint32(_cache[key])))


def decode(codes, fmt, *, dtype="float32"):
    """Decode CuPy uint8 codes of ``fmt`` into ``dtype`` (float16, bfloat16, float32, float64).

    bfloat16 comes back as its uint16 bit patterns (CuPy has no bfloat16 dtype).
    """
    cp = _cupy()
    f = get_format(fmt)
    name = "bfloat16" if str(getattr(dtype, "__name__", dtype)) == "bfloat16" else np.dtype(dtype).name
    if name not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"cannot decode to {name}; known: float16, bfloat16, float32, float64")
    c = _as_cupy(codes)
    if c.dtype != cp.uint8:
        raise TypeError(f"codes must be a uint8 CuPy array, not {c.dtype}")
    flat = cp.ascontiguousarray(c).reshape(-1)
    n = flat.size
    table = f.decode_table(name)
    nbytes = table.dtype.itemsize
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[nbytes]
    out_dtype = cp.uint16 if name == "bfloat16" else cp.dtype(name)
    out = cp.empty(n, out_dtype)
    if n == 0:
        return out.reshape(c.shape)
    tab = _device_table(("dec", f.name, name), lambda: np.ascontiguousarray(table).view(bits))
    _decode_v3(flat, out, tab, f, nbytes)
    return out.reshape(c.shape)


def _decode_v3(flat, out, tab, f, nbytes: int, cfg=None):
    unr, repl, threads, per_sm = cfg or DECODE_CFG[nbytes]
    k = _loader.kernel("codecs.cu", decode_v3_instance(nbytes, unr, repl), _loader.format_defines(f))
    smem = 256 * 32 * 4 if repl else 256 * nbytes
    if k.max_dynamic_shared_size_bytes < smem:
        k.max_dynamic_shared_size_bytes = smem
    n = flat.size
    vec = int(flat.data.ptr % 16 == 0 and out.data.ptr % 16 == 0)
    grid = max(1, min(-(-n // (4 * unr * threads)), _sm_count() * per_sm))
    k((grid,), (threads,), (flat, out, np.int64(n), np.int32(vec), tab), shared_mem=smem)
