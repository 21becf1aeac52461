"""Scaled quantization of CuPy arrays: the same codes and scales as :func:`fp8lab.quantize`.

Float32 (and float16) input in a deterministic mode, all on the device, no host round trip:
(1) block maxima of finite ``|x|`` (one CuPy reduction pass; exact: a maximum never rounds);
(2) the scales by the CPU's rule ported to the device (``fp8_scales`` in ``gpu/quantize.cu``,
the same double-precision operations as :func:`fp8lab.scaling.compute_scale`); (3) one cast
kernel (``fp8_quantize_f32``) that rounds ``x / s`` once, as the CPU's float32 route does.
Float64 input and stochastic rounding take the composed path: block maxima, the scale rule on
the host, ``q = fl64(x / s)`` on the GPU and :func:`fp8lab.gpu.encode`'s float64 encoder (element
``i`` draws the same random bits as on the CPU). Both are checked bit for bit against the CPU
(``docs/gpu.md``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..formats import Format
from ..scaling import Scaling, _rule_params, compute_scale

__all__ = ["quantize", "GPUQTensor", "cast_transpose", "CastTranspose", "scales_from_amax"]


@dataclasses.dataclass(frozen=True, eq=False)
class GPUQTensor:
    """Codes (uint8) and float32 scales as CuPy arrays, with the format and recipe."""

    codes: object
    scales: object
    format: Format
    scaling: Scaling
    dtype: np.dtype

    def get(self):
        """The host :class:`fp8lab.QTensor`."""
        from ..qtensor import QTensor
        return QTensor(self.codes.get(), self.scales.get(), self.format, self.scaling, dtype=self.dtype)


_kernels: dict = {}
_CHUNK = 1 << 16
#: one-pass block maxima (_block_amax); checked bit for bit against fp8lab.quantize on an H200
#: (benchmarks/gpu_codecs_v3.py, 414 cases, 2026-12-02).
FUSED_AMAX = True
#: float32 (and float16) input in deterministic modes: scales computed on the device (fp8_scales)
#: and the scaled cast in one kernel (fp8_quantize_f32, gpu/quantize.cu): no float64 quotient, no
#: host round trip. Else (float64 input, stochastic rounding) the composed path below.
FUSED_CAST = True
#: cast_transpose's grid: this many blocks per SM walk the 64 x 64 tiles (each block folds its
#: maximum into amax with one atomic); 0: one block per tile.
CT_BLOCKS_PER_SM = 8


def _instances() -> list[str]:
    """Every template instance of gpu/quantize.cu the library launches (nvcc build check)."""
    from .. import _kernels as K
    out = ["fp8_scales"]
    for m, code in K.MODE_CODES.items():
        if m == "stochastic":
            continue
        for sat in ("false", "true"):
            for cvt in ((0, 1, 2) if m == "nearest_even" else (0,)):
                out += [f"fp8_quantize_f32<{code}, {sat}, {cvt}, {t}>" for t in ("false", "true")]
                out.append(f"fp8_cast_transpose<{code}, {sat}, {cvt}>")
    return out


def _cvt_kind(f, mode: str) -> int:
    from .codecs import CVT_FORMATS
    if mode != "nearest_even" or f.name not in CVT_FORMATS:
        return 0
    return 1 + CVT_FORMATS.index(f.name)


def _fused_cast(cp, x3, f, sc, mode, sat, geom, amax=None, scales=None):
    """codes (flat) and float32 scales (flat) of float32 x3 (P, R, C), all on the device."""
    from .. import _kernels as K
    from ..codecs import _lut
    from . import _loader
    from .codecs import _device_table, _sm_count, cvt_special

    P, R, C, BR, BC, nbR, nbC = geom
    defines = _loader.format_defines(f)
    if scales is None:
        scales = _scales_of(cp, amax, f, sc)
    flat = x3.reshape(-1)
    n = flat.size
    codes = cp.empty(n, cp.uint8)
    cvt = _cvt_kind(f, mode)
    tensor = scales.size == 1
    inst = (f"fp8_quantize_f32<{K.MODE_CODES[mode]}, {'true' if sat else 'false'}, {cvt}, "
            f"{'true' if tensor else 'false'}>")
    k = _loader.kernel("quantize.cu", inst, defines)
    if cvt:
        lut, smem, threads, per_sm = codes, 0, 512, 4
        special = cvt_special(f, sat)
    else:
        lut = _device_table(("lut", f.name, mode, sat), lambda: _lut(f, "float32", mode, sat))
        smem, threads, per_sm, special = 1 << 17, 1024, 1, 0
        if k.max_dynamic_shared_size_bytes < smem:
            k.max_dynamic_shared_size_bytes = smem
    work = -(-n // 4) if tensor else n
    grid = max(1, min(-(-work // threads), _sm_count() * per_sm))
    vec = int(flat.data.ptr % 16 == 0 and codes.data.ptr % 16 == 0)
    k((grid,), (threads,), (flat, codes, np.int64(n), np.int32(vec), scales, np.int32(R), np.int32(C),
                           np.int32(BR), np.int32(BC), np.int32(nbR), np.int32(nbC), lut,
                           np.uint32(special)), shared_mem=smem)
    return codes, scales


def _scales_of(cp, amax, f, sc):
    """float32 scales (flat) of device maxima by the rule of compute_scale (fp8_scales)."""
    from . import _loader
    amax = cp.ascontiguousarray(amax, dtype=cp.float64).reshape(-1)
    scales = cp.empty(amax.size, cp.float32)
    if amax.size:
        fmax, emax = _rule_params(f)
        ks = _loader.kernel("quantize.cu", "fp8_scales", _loader.format_defines(f))
        ks((-(-amax.size // 256),), (256,), (amax, scales, np.int32(amax.size), np.float64(fmax),
                                            np.int32(emax), np.int32(sc.rule), np.int32(sc.margin)))
    return scales


def scales_from_amax(amax, fmt, scaling=None):
    """Scales for maxima held on the device, by the rule of :func:`fp8lab.scaling.compute_scale`,
    computed on the device (no host round trip; a CUDA graph can capture it).

    ``amax``: a CuPy array of finite ``|x|`` maxima (float32 or float64, any shape; Inf gives
    the largest scale, as on the CPU). ``scaling``: the recipe whose rule applies (its pow2 and
    margin; default per-tensor). Returns float32 scales of ``amax``'s shape. With
    :func:`cast_transpose`, the delayed-scaling loop of a training step stays on the GPU::

        ct = cast_transpose(x, "e4m3", scale, amax=amax)     # codes, codes.T, running max
        scale = scales_from_amax(amax, "e4m3")               # the next step's scale
    """
    import cupy as cp

    from ..qtensor import _resolve_call
    from .codecs import _as_cupy

    f, sc, _, _, _ = _resolve_call(fmt, scaling, None, None, None)
    amax = _as_cupy(amax)
    if amax.dtype not in (cp.float32, cp.float64):
        raise TypeError(f"amax must be a float32 or float64 CuPy array, got {amax.dtype}")
    return _scales_of(cp, amax, f, sc).reshape(amax.shape)


def _absmax_kernel(cp):
    """max over finite |x| as float64 (exact: |x| and the widening are exact, a maximum never
    rounds; Inf/NaN count as 0, as in the CPU's block maxima; float32 |x| widened from its bits,
    subnormals included, see codecs._F32_PREAMBLE)."""
    from .codecs import _F32_PREAMBLE
    k = _kernels.get("absmax")
    if k is None:
        k = _kernels["absmax"] = cp.ReductionKernel(
            "T x", "float64 y", "fp8lab_finite_abs(x)", "max(a, b)", "y = a", "0.0",
            "fp8lab_finite_absmax", reduce_type="double", preamble=_F32_PREAMBLE)
    return k


def _block_amax(cp, x3, P, nbR, BR, nbC, BC):
    """(P, nbR, nbC) float64 block maxima of finite |x| for float32/float64 x3 = (P, R, C) whose
    blocks tile it exactly: one fused pass (no |x|, isfinite or float64 temporaries). A single
    block per slice (per-tensor scaling) is reduced in two stages, (P, m, 2^16) -> (P, m) -> (P,):
    a reduction with few outputs runs on few thread blocks."""
    k = _absmax_kernel(cp)
    if nbR == 1 and nbC == 1:
        n = BR * BC
        x2 = x3.reshape(P, n)
        if n % _CHUNK == 0 and n >= 4 * _CHUNK:
            part = k(x2.reshape(P, n // _CHUNK, _CHUNK), axis=2)
            return k(part, axis=1).reshape(P, 1, 1)
        return k(x2, axis=1).reshape(P, 1, 1)
    return k(x3.reshape(P, nbR, BR, nbC, BC), axis=(2, 4))


def _composed_amax(cp, x3, P, R, C, BR, BC, nbR, nbC):
    """(P, nbR, nbC) float64 block maxima of finite |x| for any geometry (ragged blocks padded)."""
    from .codecs import _F32_PREAMBLE
    k = _kernels.get("finite_abs")
    if k is None:
        k = _kernels["finite_abs"] = cp.ElementwiseKernel(
            "T x", "float64 y", "y = fp8lab_finite_abs(x)", "fp8lab_finite_abs", preamble=_F32_PREAMBLE)
    a = k(x3)
    if (nbR * BR, nbC * BC) != (R, C):
        pad = cp.zeros((P, nbR * BR, nbC * BC), cp.float64)
        pad[:, :R, :C] = a
        a = pad
    return a.reshape(P, nbR, BR, nbC, BC).max(axis=(2, 4))


def quantize(x, fmt, *, scaling=None, rounding=None, saturate=None, seed=None, scales=None) -> GPUQTensor:
    """:func:`fp8lab.quantize` for a CuPy array ``x`` (float64, float32 or float16): same
    arguments, same codes and scales bit for bit; returns a :class:`GPUQTensor`."""
    import cupy as cp

    from ..qtensor import _geometry, _resolve_call
    from .codecs import _as_cupy, _device_table, encode, _positive_finite, _widen_float16, _widen_float32

    f, sc, delayed, mode, saturate = _resolve_call(fmt, scaling, rounding, saturate, seed)
    x = _as_cupy(x)
    if x.dtype not in (cp.float64, cp.float32, cp.float16):
        raise TypeError(f"x must be a float64, float32 or float16 CuPy array, got {x.dtype}")
    src_dtype = np.dtype(x.dtype)
    shape = x.shape
    sshape = sc.scale_shape(shape)
    P, R, C, BR, BC = _geometry(shape, sc)
    nbR, nbC = -(-R // BR), -(-C // BC)
    x3 = cp.ascontiguousarray(x).reshape(P, R, C)
    if delayed is not None and scales is None:
        s = delayed.compute_scale(f)
        if s is not None:
            scales = np.full(sshape, s, np.float32)
    if x.size == 0:
        return GPUQTensor(cp.empty(shape, cp.uint8), cp.ones(sshape, cp.float32), f, sc, src_dtype)
    if FUSED_CAST and mode != "stochastic" and x.dtype != cp.float64:
        x32 = x3 if x3.dtype == cp.float32 else _widen_float16(x3, cp)
        geom = (P, R, C, BR, BC, nbR, nbC)
        s_dev = None
        if scales is not None:
            s_dev = cp.asarray(np.asarray(scales.get() if isinstance(scales, cp.ndarray) else scales,
                                          np.float32))
            if s_dev.shape != tuple(sshape):
                raise ValueError(f"scales must have shape {tuple(sshape)}, got {s_dev.shape}")
            if not bool(cp.all(_positive_finite(s_dev, cp))):
                raise ValueError("scales must be finite and > 0")
            codes, s = _fused_cast(cp, x32, f, sc, mode, bool(saturate), geom,
                                   scales=cp.ascontiguousarray(s_dev).reshape(-1))
        else:
            if FUSED_AMAX and (nbR * BR, nbC * BC) == (R, C):
                amax = _block_amax(cp, x32, P, nbR, BR, nbC, BC)
            else:
                amax = _composed_amax(cp, x32, P, R, C, BR, BC, nbR, nbC)
            codes, s = _fused_cast(cp, x32, f, sc, mode, bool(saturate), geom, amax=amax)
        return GPUQTensor(codes.reshape(shape), s.reshape(sshape), f, sc, src_dtype)
    if scales is not None:
        s_host = np.asarray(scales.get() if isinstance(scales, cp.ndarray) else scales, np.float32)
        if s_host.shape != tuple(sshape):
            raise ValueError(f"scales must have shape {tuple(sshape)}, got {s_host.shape}")
        if not (np.isfinite(s_host).all() and (s_host > 0).all()):
            raise ValueError("scales must be finite and > 0")
    elif FUSED_AMAX and x.dtype != cp.float16 and (nbR * BR, nbC * BC) == (R, C):
        amax = _block_amax(cp, x3, P, nbR, BR, nbC, BC)
        s_host = compute_scale(amax.get(), f, sc)
    else:
        amax = _composed_amax(cp, x3, P, R, C, BR, BC, nbR, nbC)
        s_host = compute_scale(amax.get(), f, sc)
    # float32 widened on the host or from its bits: CuPy's astype would flush subnormals
    S = cp.asarray(np.ascontiguousarray(s_host, np.float32).astype(np.float64)).reshape(P, nbR, nbC)
    x64 = _widen_float32(x3, cp) if x3.dtype == cp.float32 else x3.astype(cp.float64)
    if nbR == 1 and nbC == 1:
        q = x64 / S.reshape(P, 1, 1)
    else:
        s_el = S[:, cp.arange(R) // BR][:, :, cp.arange(C) // BC]
        q = x64 / s_el
    # a NaN quotient takes x's sign, as on the CPU (GPU arithmetic returns NaN without it)
    nans = _device_table(("nan64",), lambda: np.array([0x7FF8000000000000, 0xFFF8000000000000],
                                                      np.uint64)).view(cp.float64)
    q = cp.where(cp.isnan(q), cp.where(cp.signbit(x3), nans[1], nans[0]), q)
    codes = encode(q.reshape(shape), f.name, rounding=mode, saturate=bool(saturate), seed=seed)
    return GPUQTensor(codes, cp.asarray(np.ascontiguousarray(s_host, np.float32)).reshape(sshape), f, sc,
                      src_dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class CastTranspose:
    """What :func:`cast_transpose` returns.

    ``q``: the codes (R, C) and the scale, as :func:`quantize` gives them; ``t``: the codes
    transposed, a (C, R) view whose rows start 16 bytes apart (as :func:`fp8lab.gpu.gemm.transpose`
    returns them), or None; ``amax``: a (1,) float32 CuPy array, the maximum finite ``|x|`` (the
    running maximum when an ``amax`` buffer was passed in)."""

    q: GPUQTensor
    t: object
    amax: object


def _device_scale(cp, scale, check: bool, name: str = "scale", host=None):
    """A (1,) float32 CuPy array holding the per-tensor scale (validated unless ``check`` is
    False for a device array, which would need a host round trip). ``host``: how a validated
    host number becomes a device array (default a new one)."""
    from .codecs import _positive_finite
    if isinstance(scale, cp.ndarray):
        if scale.dtype != cp.float32 or scale.size != 1:
            raise TypeError(f"{name} as a CuPy array must be float32 with one element, got {scale.dtype} "
                            f"of shape {scale.shape}")
        s = cp.ascontiguousarray(scale).reshape(1)
        if check and not bool(_positive_finite(s, cp)[0]):
            raise ValueError(f"{name} must be finite and > 0, got {float(s[0].get())}")
        return s
    try:
        v = np.float32(scale)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number or a one-element float32 CuPy array, got "
                        f"{type(scale).__name__}") from None
    if np.ndim(scale) != 0 or not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be one finite float32 value > 0, got {scale!r}")
    return cp.full(1, v, cp.float32) if host is None else host(v)


def _amax_buffer(cp, amax, name: str = "amax"):
    """``amax`` checked to be a running-maximum buffer ((1,) float32, contiguous), or None."""
    if amax is not None and not (isinstance(amax, cp.ndarray) and amax.dtype == cp.float32
                                 and amax.shape == (1,) and amax.flags.c_contiguous):
        raise TypeError(f"{name} must be a (1,) float32 CuPy array (non-negative; updated in place)")
    return amax


def cast_transpose(x, fmt, scale, *, rounding=None, saturate=None, transpose=True, amax=None,
                   check=True) -> CastTranspose:
    """Codes of a 2-D float32 (or float16) CuPy array at a given per-tensor scale, their transpose
    and the maximum finite ``|x|``, in one pass over ``x`` (one kernel launch).

    The cast of FP8 training with delayed scaling: the scale comes from earlier maxima (for
    example :class:`fp8lab.scaling.DelayedScaling`), so no maximum pass precedes the cast, and the
    maximum this call measures feeds the next scale. The transposed codes are the K-major operand
    :func:`fp8lab.gpu.gemm.gemm` reads for the other GEMMs of a training step (``X`` in ``X W^T``
    and ``X^T`` in ``dY^T X``).

    Parameters
    ----------
    x : (R, C) CuPy array, float32 or float16 (widened exactly); rows may be strided.
    fmt : str or Format
    scale : float, or a one-element float32 CuPy array (read on the device, so the call does not
        wait for the host; a CUDA graph can capture it with ``check=False``). ``x ~= decode * scale``.
    rounding, saturate : as :func:`quantize` (deterministic modes; not ``"stochastic"``).
    transpose : also write the transposed codes (default True).
    amax : optional (1,) float32 CuPy array holding a non-negative value; updated in place to the
        maximum of itself and this ``x``'s (a running maximum over several calls). Default: a new
        zero-initialized array.
    check : validate a device ``scale`` (finite, > 0) at the cost of one host round trip.

    Under CUDA graph capture, pass float32 rows with a 4-byte-aligned stride, a device ``scale``
    with ``check=False`` and an ``amax`` buffer: then the call allocates only its outputs and makes
    no temporaries a replay would depend on (keep the returned arrays alive with the graph).

    Returns
    -------
    CastTranspose
        ``q.codes`` equal bit for bit to ``quantize(x, fmt, scales=scale).codes`` (and to the
        CPU's :func:`fp8lab.quantize` with the same scale), ``t`` equal to ``q.codes.T``.
    """
    import cupy as cp

    from .codecs import _as_cupy, _sm_count, _widen_float16
    from .gemm import _kmajor_stride

    f, sc, k, lut, special = _ct_plan(cp, fmt, rounding, saturate)
    x = _as_cupy(x)
    if x.dtype not in (cp.float32, cp.float16) or x.ndim != 2:
        raise TypeError(f"x must be a 2-D float32 or float16 CuPy array, got {x.dtype} of shape "
                        f"{x.shape} (fp8lab.gpu.quantize.quantize takes any shape and float64)")
    if x.dtype == cp.float16:
        x = _widen_float16(x, cp)
    elif x.size and (x.strides[1] != 4 or x.strides[0] % 4 or x.strides[0] < 0):
        x = cp.ascontiguousarray(x)
    s = _device_scale(cp, scale, check)
    amax = _amax_buffer(cp, amax)
    if amax is None:
        amax = cp.zeros(1, cp.float32)
    R, C = x.shape
    codes = cp.empty((R, C), cp.uint8)
    rp = _kmajor_stride(R)   # the layout fp8lab.gpu.gemm.transpose returns
    tbuf = cp.empty((C, rp), cp.uint8) if transpose else None
    if x.size:
        ldx = x.strides[0] // 4 if R > 1 else C
        tiles = -(-C // 64) * -(-R // 64)
        if tiles >= 2**31:
            raise ValueError(f"x of shape {x.shape} has too many 64 x 64 tiles for one launch "
                             f"({tiles} >= 2^31); cast it in row blocks")
        grid = tiles if CT_BLOCKS_PER_SM <= 0 else min(tiles, _sm_count() * CT_BLOCKS_PER_SM)
        k((grid,), (256,),
          (x, codes, tbuf if transpose else np.uint64(0), amax.view(cp.uint32), s, np.int32(R), np.int32(C),
           np.int64(ldx), np.int64(C), np.int64(rp), codes if lut is None else lut, np.uint32(special)))
    q = GPUQTensor(codes, s.reshape(sc.scale_shape((R, C))), f, sc, np.dtype(np.float32))
    return CastTranspose(q, tbuf[:, :R] if transpose else None, amax)


_ct_plans: dict = {}


def _ct_plan(cp, fmt, rounding, saturate):
    """(format, Scaling, kernel, table or None, special) of a cast_transpose call, memoized per
    device and arguments (a call's Python is what small casts are bound by)."""
    try:
        key = (cp.cuda.Device().id, fmt, rounding, saturate)
        plan = _ct_plans.get(key)
    except TypeError:   # unhashable argument: resolve it (and let validation say what is wrong)
        key, plan = None, None
    if plan is not None:
        return plan
    from .. import _kernels as K
    from ..codecs import _lut
    from . import _loader
    from .codecs import _device_table, cvt_special
    f, sc, _, mode, sat = _resolve_cast_args(fmt, rounding, saturate)
    cvt = _cvt_kind(f, mode)
    if cvt:
        lut, special = None, cvt_special(f, sat)
    else:
        lut = _device_table(("lut", f.name, mode, sat), lambda: _lut(f, "float32", mode, sat))
        special = 0
    inst = f"fp8_cast_transpose<{K.MODE_CODES[mode]}, {'true' if sat else 'false'}, {cvt}>"
    plan = (f, sc, _loader.kernel("quantize.cu", inst, _loader.format_defines(f)), lut, special)
    if key is not None:
        _ct_plans[key] = plan
    return plan


def _resolve_cast_args(fmt, rounding, saturate):
    from ..codecs import resolve_rounding
    from ..formats import get_format
    from ..qtensor import _resolve_call
    if resolve_rounding(get_format(fmt), rounding) == "stochastic":
        raise ValueError("cast_transpose rounds deterministically; for rounding='stochastic' use "
                         "fp8lab.gpu.quantize.quantize")
    return _resolve_call(fmt, "tensor", rounding, saturate, None)
