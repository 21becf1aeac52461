"""Scaled GEMMs of 8-bit operands on the GPU (CuPy raw kernels, ``gpu/gemm_wgmma.cu``, ``gpu/gemm.cu``).

``C = (decode(A) * scale_a) @ (decode(B) * scale_b)`` with fp32 accumulation, for any pair of
fp8lab formats. Kernels (``kernel=`` forces one; :data:`last_kernel` names the one that ran):

- ``"wgmma-fp8"``: e4m3/e5m2 pairs on FP8 tensor cores (Hopper ``wgmma``, QGMMA), operands fed by
  TMA into 128B-swizzled shared memory, the partial sum promoted into an fp32 accumulator every
  128 K-elements (while the next K-tile's wgmma run). 16-bit outputs with 16-byte aligned rows
  leave through shared memory and TMA stores that overlap the next tile. Products with few output
  tiles and K >= 2048 split K among CTAs (:data:`SPLIT_K`; a second launch adds the splits' fp32
  sums in order). Large single GEMMs run 128 x 192 or 128 x 256 tiles (:data:`WIDE_TILES`,
  :data:`WIDE_FP8`; same bits). Rows whose byte stride is not a multiple of 16 are first copied
  into a padded buffer; ``layout="nn"`` transposes B once into K-major (``transpose_u8``), both counted in the
  call's time (:func:`transpose` makes K-major codes once, for reuse with ``layout="nt"``).
- ``"wgmma-f16"``: any other format pair (hif8, the fnuz formats): both operands are decoded to
  fp16 (exact for every fp8lab format) in one launch (``decode_f16_pair``), then multiplied by the same kernel on
  fp16 tensor cores (HGMMA; large single GEMMs in 128 x 256 tiles accumulating in fp32 over the
  whole K). The decode is counted in the call's time.
- ``"mma"``: the first kernel (``gpu/gemm.cu``): in-kernel decode to fp16 and ``mma.sync``; any
  format, shape and stride. Used when the device is not sm_90 or the wgmma path is refused.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from ..formats import get_format
from . import _loader
from ._cache import BoundedCache
from .codecs import _as_cupy, _device_table, _sm_count

__all__ = ["gemm", "gemm_grouped", "gemm_fused", "transpose", "SCALINGS", "LAYOUTS", "OUT_DTYPES",
           "FUSED_OUT", "KERNELS", "last_kernel"]

SCALINGS = ("tensor", "row_col", "block")
#: output types of :func:`gemm_fused`: OUT_DTYPES, then 8-bit codes (``OUT`` 3 and 4 in the kernel)
FUSED_OUT = ("float32", "bfloat16", "float16", "e4m3", "e5m2")
LAYOUTS = ("nt", "nn")
OUT_DTYPES = ("float32", "bfloat16", "float16")
BLOCK = 128
_TILE = (128, 128)
KERNELS = ("auto", "wgmma", "mma")
_FP8_HW = {"e4m3": 0, "e5m2": 1}   # fp8lab formats whose codes are the hardware's FP8 types
_STAGES = {1: 6, 2: 3}             # pipeline stages per element size (32 KB / 64 KB per stage)
_WG_THREADS = 384                  # threads per gemm_wgmma CTA: 3 warpgroups (WG_THREADS there)
#: name of the kernel the last :func:`gemm` call ran ("wgmma-fp8", "wgmma-f16" or "mma")
last_kernel = None


def _instance(layout: str, scaling: str, out: str) -> str:
    return f"fp8_gemm_f16<{LAYOUTS.index(layout)}, {SCALINGS.index(scaling)}, {OUT_DTYPES.index(out)}>"


def _instances() -> list[str]:
    return [_instance(lay, s, o) for lay in LAYOUTS for s in SCALINGS for o in OUT_DTYPES]


#: 16-bit outputs of the wgmma kernel leave through shared memory and TMA stores that drain while
#: the next tile runs (``CMAP`` in gpu/gemm_wgmma.cu); False: direct stores from registers.
TMA_STORE = True
#: wgmma consumers promote K-tile kt while the wgmma of kt+1 run (two partial accumulators,
#: ``OVL`` in gpu/gemm_wgmma.cu); False: issue, wait, promote. Same results bit for bit.
WGMMA_OVERLAP = True
#: wide CTA tiles for single GEMMs (``BN`` in gpu/gemm_wgmma.cu; not for block scales on the f16 path):
#: 128 x 192 or 128 x 256 for FP8 pairs (:data:`WIDE_FP8`; the same bits as 128 x 128), 128 x 256
#: for the f16 path (fp32 accumulation in the tensor cores over the whole K instead of partial sums
#: promoted every 128 K-elements: another order of the same fp32 additions). "auto": the first
#: width of :data:`WIDE_FP8`'s choice (f16: 256) whose tiles fill the SMs at least twice and leave
#: under 4% more columns unused than 128-wide ones, else 128; "always": the first width wherever
#: the kernel has wide tiles (one GEMM, no split-K); "never".
WIDE_TILES = "auto"
#: width of the FP8 pairs' wide tiles: 192 (one m64n192 partial per K-tile), 256 (each K-tile as
#: two m64n128 halves through one partial) or "auto": for scales per tensor or per row and column
#: 192 first where K > 1024 (a long K loop: one wgmma chain per K-tile wins), else 256 first (it
#: halves the tiles' fixed costs); 256 for block scales (slower on 192, faster than 128). The
#: choices follow the H200 measurements in benchmarks/NOTES-gpu.md. Same bits at every width.
WIDE_FP8 = "auto"
# the kernel's wide tiles, (element size, width): their pipeline stages (40 / 48 / 48 KB each)
_WIDE_STAGES = {(1, 192): 4, (1, 256): 3, (2, 256): 3}


def _wide_widths(es: int) -> tuple:
    """The kernel's wide tile widths for ``es``-byte operands, narrowest first."""
    return tuple(sorted(bn for e, bn in _WIDE_STAGES if e == es))


def _wide(es: int, scaling: str, K: int) -> tuple:
    """Wide tile widths to try, in order, for ``es``-byte operands (1 FP8 codes, 2 decoded fp16)."""
    fp8 = _wide_widths(1)
    if WIDE_FP8 != "auto" and WIDE_FP8 not in fp8:
        raise ValueError(f"WIDE_FP8 must be 'auto' or one of {', '.join(map(str, fp8))}, got {WIDE_FP8!r}")
    if es == 2:
        return _wide_widths(2)
    if WIDE_FP8 != "auto":
        return (WIDE_FP8,)
    if scaling == "block":
        return fp8[-1:]
    return fp8 if K > 1024 else fp8[::-1]


def _wg_stages(es: int, bn: int) -> int:
    """Pipeline stages of a plain gemm_wgmma instance: per element size, and for its tile width."""
    return _STAGES[es] if bn == 128 else _WIDE_STAGES[(es, bn)]


def _wg_instance(ta: int, tb: int, scaling: str, out: str, ovl: bool | None = None, bn: int = 128) -> str:
    head = f"gemm_wgmma<{ta}, {tb}, {SCALINGS.index(scaling)}, {OUT_DTYPES.index(out)}, "
    stages = _wg_stages(2 if ta == 2 else 1, bn)
    if bn != 128:
        return head + f"{stages}, 0, 0, {bn}>"
    ovl = WGMMA_OVERLAP if ovl is None else ovl
    return head + f"{stages}, {int(ovl)}>"


def _tile_n(es: int, scaling: str, G: int, splits: int, M: int, N: int, K: int) -> int:
    """Width of a launch's CTA tiles under :data:`WIDE_TILES`."""
    if WIDE_TILES not in ("auto", "always", "never"):
        raise ValueError(f"WIDE_TILES must be 'auto', 'always' or 'never', got {WIDE_TILES!r}")
    if WIDE_TILES == "never" or G != 1 or splits != 1 or (scaling == "block" and es == 2):
        return 128
    widths = _wide(es, scaling, K)
    if WIDE_TILES == "always":
        return widths[0]
    for bn in widths:
        tn = -(-N // bn)
        if -(-M // 128) * tn >= 2 * _sm_count() and tn * bn <= 1.04 * (-(-N // 128) * 128):
            return bn
    return 128


def _fused_instance(ta: int, tb: int, out: str, qa: int) -> str:
    """gemm_wgmma instance of a :func:`gemm_fused` call: ``qa`` 0 (A as codes, overlapped
    promotion) or the quantize-on-load input (1 bfloat16, 2 float16, 3 float32), converted in the
    producer, or plus 4, converted once before the GEMM (no overlap in either: with it ptxas spills
    hundreds of bytes in the 8-bit-output instances)."""
    head = f"gemm_wgmma<{ta}, {tb}, 0, {FUSED_OUT.index(out)}, {_QA_STAGES if 0 < qa < _QA_ONCE else _STAGES[1]}, {int(qa == 0)}"
    return head + (f", {qa}>" if qa else ">")   # qa = 0: gemm's own instance (default QA)


def _wg_instances() -> list[str]:
    pairs = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 2)]
    fused = [_fused_instance(ta, tb, o, qa) for ta, tb in pairs[:4] for qa in _QA_MODES for o in FUSED_OUT
             if qa or o not in OUT_DTYPES]
    plain = [_wg_instance(ta, tb, s, o, v) for ta, tb in pairs for s in SCALINGS for o in OUT_DTYPES
             for v in (False, True)]
    plain += [_wg_instance(ta, tb, s, o, bn=bn) for ta, tb in pairs for bn in _wide_widths(2 if ta == 2 else 1)
              for s in SCALINGS for o in OUT_DTYPES if ta != 2 or s != "block"]
    others = ["transpose_u8", "decode_f16_rows", "decode_f16_pair", "fp8q_check<1, 0>", "fp8q_check<2, 0>",
              "fp8q_check<1, 1>", "fp8q_check<2, 1>"]
    return plain + fused + others + [f"splitk_reduce<{i}, {j}>" for i in range(len(SCALINGS))
                                     for j in range(len(OUT_DTYPES))]


# --- tensor maps (cuTensorMapEncodeTiled through the driver library) -----------------------------
_tmap_cache = BoundedCache(256)
_encode_fn = None


def _encoder():
    global _encode_fn
    if _encode_fn is None:
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        f = lib.cuTensorMapEncodeTiled
        f.restype = ctypes.c_int
        u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                      u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _encode_fn = f
    return _encode_fn


def _encode_tmap(ptr: int, es: int, dims, strides, box) -> bytes:
    """128-byte CUtensorMap: ``dims`` innermost first, byte ``strides`` of the outer dimensions,
    ``box`` in elements, 128B swizzle, out-of-bounds elements read as zero (and not written)."""
    import ctypes
    buf = ctypes.create_string_buffer(256)
    addr = (ctypes.addressof(buf) + 63) & ~63
    n = len(dims)
    # data type UINT8 = 0 / UINT16 = 1, interleave none, swizzle 128B = 3, L2 promotion 256B = 3,
    # OOB fill none (zeros)
    r = _encoder()(ctypes.c_void_p(addr), 0 if es == 1 else 1, n, ctypes.c_void_p(ptr),
                   (ctypes.c_uint64 * n)(*dims), (ctypes.c_uint64 * (n - 1))(*strides),
                   (ctypes.c_uint32 * n)(*box), (ctypes.c_uint32 * n)(*([1] * n)), 0, 3, 3, 0)
    if r != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {r} "
                           f"(dims={tuple(dims)}, strides={tuple(strides)}, elem={es})")
    return ctypes.string_at(addr, 128)


# The map encodings are pure functions of their integers (memoized: a plan rebuilt for a new
# output address re-encodes only C's map)
@functools.lru_cache(maxsize=1024)
def _tmap_bytes(ptr: int, rows: int, cols: int, stride: int, es: int, box_rows: int = 128) -> bytes:
    """Tensor map of a row-major (rows, cols) operand of ``es``-byte elements: 2-D, box
    (``box_rows`` rows, 128 bytes)."""
    return _encode_tmap(ptr, es, (cols, rows), (stride,), (128 // es, box_rows))


@functools.lru_cache(maxsize=1024)
def _cmap_at(ptr: int, M: int, N: int, G: int) -> bytes:
    return _encode_tmap(ptr, 2, (N, M, G), (N * 2, M * N * 2), (64, 64, 1))


def _cmap_bytes(c, M: int, N: int, G: int) -> bytes:
    """Tensor map of a C-contiguous 16-bit output holding G (M, N) products: 3-D (N, M, G), box
    (64 columns, 64 rows, 1): TMA clips each GEMM's stores at its own M and N."""
    return _cmap_at(c.data.ptr, M, N, G)


def _tmaps(a, b, es, c=None, bn=128):
    """Device buffer holding A's and B's tensor maps (and C's, ``c`` = (out, M, N, G)); cached
    per (pointers, shapes, strides). ``bn``: rows of B's box (the CTA tile's width)."""
    import cupy as cp
    ckey = None if c is None else (c[0].data.ptr,) + tuple(c[1:])
    key = (cp.cuda.Device().id, a.data.ptr, a.shape, a.strides[0], b.data.ptr, b.shape, b.strides[0], es,
           ckey, bn)
    buf = _tmap_cache.get(key)
    if buf is None:
        host = _tmap_bytes(a.data.ptr, a.shape[0], a.shape[1], a.strides[0], es) + \
            _tmap_bytes(b.data.ptr, b.shape[0], b.shape[1], b.strides[0], es, bn)
        if c is not None:
            host += _cmap_bytes(*c)
        _tmap_cache.put(key, _upload(host, cp))
        return _tmap_cache.get(key)[0]
    return buf[0]


def _upload(host: bytes, cp):
    """(device copy of ``host``, its pinned staging memory). Copied from pinned memory, ordered on
    the current stream: no host synchronization, and a stream being captured into a CUDA graph
    records the copy (keep the pinned memory alive as long as the copy may be replayed)."""
    pinned = cp.cuda.alloc_pinned_memory(len(host))
    staged = np.frombuffer(pinned, np.uint8, len(host))
    staged[:] = np.frombuffer(host, np.uint8)
    buf = cp.empty(len(host), cp.uint8)
    cp.cuda.runtime.memcpyAsync(buf.data.ptr, staged.ctypes.data, len(host),
                                cp.cuda.runtime.memcpyHostToDevice, cp.cuda.get_current_stream().ptr)
    return buf, pinned


_work = BoundedCache(32)


def _workspace(role, rows, cols, dtype, cp):
    """A cached (rows, cols) buffer per device, role, shape and dtype, zero-filled when made: the
    operands this module derives (decoded, transposed, padded) keep the same address from call to
    call, so their tensor maps stay cached (no host->device copy per call). Stream-ordered reuse:
    calls on one stream only."""
    key = (cp.cuda.Device().id, role, rows, cols, np.dtype(dtype).str)
    buf = _work.get(key)
    if buf is None:
        if len(_work) >= _work.limit:
            _work.evict()
            _plans.evict()   # plans hold workspaces
        buf = _work.put(key, cp.zeros((rows, cols), dtype))
    return buf


def _k_major(x, es, cp, role="pad", whole_rows=False):
    """``x`` (rows, K) itself when TMA can read it (16-byte aligned base and row stride), else a
    zero-padded copy with the row stride rounded up to 16 bytes, in the workspace of ``role``
    (None: a new buffer). ``whole_rows``: also copy unless each row can be read up to K rounded
    up to 16 bytes inside x's allocation (the quantize-on-load reads 16-byte chunks and masks
    what lies past K)."""
    rows, K = x.shape
    ok = x.data.ptr % 16 == 0 and x.strides[0] % 16 == 0 and x.strides[0] >= K * es
    if ok and whole_rows and K * es % 16:
        # the last row's read passes the array's end: only inside an allocation whose size is
        # known (CuPy's own; an imported array's memory, DLPack's, may report another size)
        mem = x.data.mem
        ok = (isinstance(mem, _owned_memory(cp))
              and x.data.ptr - mem.ptr + (rows - 1) * x.strides[0] + _kmajor_stride(K * es) <= mem.size)
    if ok:
        return x
    kp = _kmajor_stride(K * es) // es
    # padding columns stay zero
    y = cp.zeros((rows, kp), x.dtype) if role is None else _workspace(role, rows, kp, x.dtype, cp)
    y[:, :K] = x
    return y[:, :K]


@functools.lru_cache(maxsize=None)
def _owned_memory(cp) -> tuple:
    """CuPy's memory classes whose ``size`` is the allocation's."""
    m = cp.cuda.memory
    return tuple(t for t in (getattr(m, "PooledMemory", None), getattr(m, "Memory", None)) if t is not None)


def _kmajor_stride(k: int) -> int:
    """A row of ``k`` bytes rounded up to a multiple of 16: the row stride of operands the wgmma
    kernel reads through TMA (which needs 16-byte aligned row strides)."""
    return -(-k // 16) * 16


def _transpose_launch(K: int, N: int, ldb: int, ldt: int):
    """Kernel, grid, block and scalar arguments of one ``transpose_u8`` launch: (K, N) codes with
    row stride ``ldb`` -> (N, K) codes with row stride ``ldt`` (64 x 64 byte tiles)."""
    k = _loader.kernel("gemm_wgmma.cu", "transpose_u8")
    return k, (-(-N // 64), -(-K // 64)), (256,), (np.int32(K), np.int32(N), np.int32(ldb), np.int32(ldt))


def _transpose(b, cp, launches):
    """(K, N) uint8 -> (N, K) uint8, K-major with a 16-byte row stride: a workspace written by
    the ``transpose_u8`` launch appended to ``launches`` (it reads the call's B)."""
    K, N = b.shape
    kp = _kmajor_stride(K)
    t = _workspace("bt", N, kp, cp.uint8, cp)   # padding columns stay zero
    k, grid, block, dims = _transpose_launch(K, N, b.strides[0], kp)
    launches.append((k, grid, block, lambda a_, b_, out, sa, sb: (b_, t) + dims, 0))
    return t[:, :K]


def _f16_table(f):
    """The format's 256-entry code -> fp16 table on the device (uint16 bits), cached."""
    return _device_table(("dec", f.name, "float16"),
                         lambda: np.ascontiguousarray(f.decode_table("float16")).view(np.uint16))


def _decode_f16(x, f, cp, role, launches=None):
    """(rows, K) codes -> (rows, K) float16 view of a buffer whose row stride is K rounded up to 8
    elements (16 bytes; the padding is zero), decoded through the format's fp16 table. The buffer:
    the workspace of ``role`` (None: a new one). ``launches``: the ``decode_f16_rows`` launch is
    appended there (with fixed arguments) instead of run now."""
    rows, K = x.shape
    kp = _kmajor_stride(2 * K) // 2
    y = cp.empty((rows, kp), cp.float16) if role is None else _workspace(role, rows, kp, cp.float16, cp)
    work = rows * (kp // 8)
    launch = (_loader.kernel("gemm_wgmma.cu", "decode_f16_rows"), (max(1, min(-(-work // 256), _sm_count() * 8)),),
              (256,), (x, y, np.int32(rows), np.int32(K), np.int32(x.strides[0]), np.int32(kp), _f16_table(f)), 0)
    if launches is None:
        k, grid, block, args, _ = launch
        k(grid, block, args)
    else:
        launches.append(launch)
    return y[:, :K]


#: decode both operands of the f16 path in one launch (decode_f16_pair) rather than two
FUSED_DECODE = True


def _decode_f16_pair(a, b, fa, fb, cp, launches, b_derived=False):
    """:func:`_decode_f16` of A (role "ha") and B (role "hb") in one launch (appended to
    ``launches``). The launch reads the call's own A and B, or this ``b`` when ``b_derived`` (a
    workspace made from the call's B, e.g. its transpose)."""
    (ra, K), rb = a.shape, b.shape[0]
    kp = _kmajor_stride(2 * K) // 2
    ya = _workspace("ha", ra, kp, cp.float16, cp)
    yb = _workspace("hb", rb, kp, cp.float16, cp)
    ta, tb = _f16_table(fa), _f16_table(fb)
    k = _loader.kernel("gemm_wgmma.cu", "decode_f16_pair")
    work = (ra + rb) * (kp // 8)
    consts = (np.int32(ra), np.int32(a.strides[0]), np.int32(rb), np.int32(b.strides[0]),
              np.int32(K), np.int32(kp))
    bw = b if b_derived else None   # a plan must not hold the caller's arrays (see _gemm_wgmma)
    launches.append((k, (max(1, min(-(-work // 256), _sm_count() * 8)),), (256,),
                     lambda a_, b_, out, sa, sb: (a_, ya, consts[0], consts[1],
                                                  b_ if bw is None else bw, yb, consts[2], consts[3],
                                                  consts[4], consts[5], ta, tb), 0))
    return ya[:, :K], yb[:, :K]


_NULL = np.uint64(0)
# gemm_wgmma's quantize-on-load and epilogue arguments when neither is used: xa, ldx, xspec,
# xcodes, xamax, bias, relu, os, ospec, ocodes, oamax, xq, ldq, qsync, qparts
_NO_FUSION = (_NULL, np.int64(0), np.uint32(0), np.uint32(0), _NULL, _NULL, np.int32(0), _NULL,
              np.uint32(0), np.uint32(0), _NULL, _NULL, np.int32(0), _NULL, np.int32(0))


def _wg_smem(es: int, stages: int, cmap: bool, bn: int = 128) -> int:
    """Dynamic shared memory of a gemm_wgmma launch: the stage ring (A and B tiles of 128 and
    ``bn`` rows of 128 bytes, times ``es``, or once for the f16 wide tiles' 64-element K-tiles), 1 KB
    for aligning it, and the two consumers' 64 x ``bn`` 16-bit C staging buffers of the TMA-store
    epilogue."""
    ka = 1 if es == 2 and bn > 128 else es
    return stages * (128 + bn) * 128 * ka + 1024 + (2 * 128 * bn if cmap else 0)


def _wgmma_ok() -> bool:
    import cupy as cp
    return cp.cuda.Device().compute_capability == "90"


def _gemm_wgmma(a, b, fa, fb, sa, sb, scaling, layout, out_dtype, out, kb, cp, G=1):
    """The launches of one wgmma-path call, as (kernel, grid, block, args, shared memory).

    Derived operands (decoded, transposed, padded) are written by launches in the list, or by
    CuPy copies made here (the padded path), in stream order before the GEMM. G > 1: ``a`` and
    ``b`` hold G GEMMs' operands stacked by rows ((G*M, K), (G*N, K), NT only)."""
    M, K = a.shape
    M //= G
    fp8 = fa.name in _FP8_HW and fb.name in _FP8_HW
    launches = []
    bt = _transpose(b, cp, launches) if layout == "nn" else b
    if fp8:
        ta, tb, es = _FP8_HW[fa.name], _FP8_HW[fb.name], 1
        a2, b2 = _k_major(a, 1, cp, "pa"), _k_major(bt, 1, cp, "pb")
    else:
        ta = tb = 2
        es = 2
        if FUSED_DECODE:
            a2, b2 = _decode_f16_pair(a, bt, fa, fb, cp, launches, b_derived=bt is not b)
        else:
            _run(launches, a, b, out, sa, sb)   # the transpose first
            launches = []
            a2, b2 = _decode_f16(a, fa, cp, "ha"), _decode_f16(bt, fb, cp, "hb")
    N = b2.shape[0] // G
    tiles = G * (-(-M // 128)) * (-(-N // 128))
    splits = _splits(tiles, -(-K // 128), G)
    bn = _tile_n(es, scaling, G, splits, M, N, K)
    tiles = G * (-(-M // 128)) * (-(-N // bn))
    # TMA-store epilogue: 16-bit outputs whose rows start on 16-byte boundaries
    cmap = (TMA_STORE and splits == 1 and out_dtype != "float32" and out.data.ptr % 16 == 0
            and (N * 2) % 16 == 0)
    maps = _tmaps(a2, b2, es, (out, M, N, G) if cmap else None, bn)
    k = _loader.kernel("gemm_wgmma.cu", _wg_instance(ta, tb, scaling, out_dtype, bn=bn))
    smem = _wg_smem(es, _wg_stages(es, bn), cmap, bn)
    if k.max_dynamic_shared_size_bytes < smem:
        k.max_dynamic_shared_size_bytes = smem
    dims = (np.int32(M), np.int32(N), np.int32(K), np.int32(N), np.int32(kb), np.int32(G),
            np.int32(cmap), np.int32(splits))
    # The launch arguments take the call's arrays when run, never from this scope: a cached plan
    # holding the caller's output (or A, B) would keep that memory alive while the plan lives
    # (up to _plans.limit outputs), and its address from being reused by the next call's output.
    ws = _workspace("splitk", splits * M, N, cp.float32, cp) if splits > 1 else None
    launches.append((k, (min(tiles * splits, _sm_count()),), (_WG_THREADS,),
                     lambda a, b, out, sa, sb: (maps, out, dims[0], dims[1], dims[2], dims[3], sa,
                                                sb, dims[4], dims[5], dims[6], dims[7],
                                                out if ws is None else ws, _NULL) + _NO_FUSION,
                     smem))
    if splits > 1:
        r = _loader.kernel("gemm_wgmma.cu", f"splitk_reduce<{SCALINGS.index(scaling)}, "
                                            f"{OUT_DTYPES.index(out_dtype)}>")
        grid = max(1, min(-(-(M * N) // 256), _sm_count() * 8))
        launches.append((r, (grid,), (256,),
                         lambda a, b, out, sa, sb: (ws, out, dims[0], dims[1], dims[7], sa, sb), 0))
    # replayable when every derived operand is made by a launch of the list (no padded copy or
    # separate decode made here)
    replay = (a2 is a and b2 is bt) if fp8 else FUSED_DECODE
    return launches, ("wgmma-fp8" if fp8 else "wgmma-f16"), replay


#: split-K for products with few output tiles and a long K (``splits`` in gpu/gemm_wgmma.cu): the
#: K-tiles of each output tile are shared among CTAs that would otherwise idle, and a second
#: launch adds their fp32 sums in split order. Changes the order of the fp32 additions (a different
#: rounding than one split; deterministic). False: one CTA per output tile always.
SPLIT_K = True


def _splits(tiles: int, ktiles: int, G: int) -> int:
    """Number of K-splits for a launch: 1 unless SPLIT_K, G = 1, fewer tiles than half the SMs and
    at least 16 K-tiles (K >= 2048); then enough splits to cover the SMs, each of >= 4 K-tiles."""
    sms = _sm_count()
    if not SPLIT_K or G != 1 or 2 * tiles > sms or ktiles < 16:
        return 1
    return max(1, min(sms // tiles, ktiles // 4))


def _run(launches, a, b, out, sa, sb):
    for k, grid, block, args, smem in launches:
        k(grid, block, args(a, b, out, sa, sb), shared_mem=smem)


#: launch lists of recent wgmma calls, keyed by everything they depend on (device, pointers,
#: shapes, strides, formats, recipe, output): a repeated call skips the Python that builds them.
#: They hold the workspaces and tensor maps they use, not the caller's arrays.
_plans = BoundedCache(256)


def _wgmma_call(a, b, fa, fb, sa, sb, scaling, layout, out_dtype, out, kb, cp, G=1, plan_out=None) -> str:
    """Run one wgmma-path call through its cached launch plan (built on a miss); the kernel name.
    ``plan_out``: a list that receives the plan where it is replayable."""
    key = (cp.cuda.Device().id, G, a.data.ptr, a.shape, a.strides, b.data.ptr, b.shape, b.strides,
           fa.name, fb.name, scaling, layout, out_dtype, out.data.ptr, sa.data.ptr, sb.data.ptr,
           FUSED_DECODE, WGMMA_OVERLAP, TMA_STORE, SPLIT_K, WIDE_TILES, WIDE_FP8)
    plan = _plans.get(key)
    if plan is None:
        launches, name, replay = _gemm_wgmma(a, b, fa, fb, sa, sb, scaling, layout, out_dtype, out,
                                             kb, cp, G)
        if replay:
            plan = _plans.put(key, (launches, name))
    else:
        launches, name = plan
    if plan is not None and plan_out is not None:
        plan_out.append(plan)
    _run(launches, a, b, out, sa, sb)
    return name


_scalars = BoundedCache(1024)


def _scale(s, shape, name):
    import cupy as cp
    if shape == (1,) and isinstance(s, (int, float, np.floating, np.integer)):
        # a host scalar: one cached device copy per value (no synchronous copy per call)
        key = (cp.cuda.Device().id, float(np.float32(s)))
        d = _scalars.get(key)
        if d is None:
            d = _scalars.put(key, cp.full((1,), np.float32(s), cp.float32))
        return d
    s = cp.ascontiguousarray(cp.asarray(s, dtype=cp.float32))
    if s.size == 1 and shape == (1,):
        return s.reshape(1)
    if s.shape != shape:
        raise ValueError(f"{name} must have shape {shape} for this scaling, got {s.shape}")
    return s


def _check_choices(scaling, out_dtype):
    if scaling not in SCALINGS:
        raise ValueError(f"unknown scaling {scaling!r}; known: {', '.join(SCALINGS)}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"unknown out_dtype {out_dtype!r}; known: {', '.join(OUT_DTYPES)}")


def _out_dtype(out_dtype: str):
    """The dtype of an output array: bfloat16 as its uint16 bit patterns, 8-bit formats as codes."""
    return np.dtype(np.uint16 if out_dtype == "bfloat16" else np.uint8 if out_dtype in _FP8_HW else out_dtype)


def _output(out, shape, out_dtype, cp):
    """``out`` checked (C-contiguous, ``shape``, the dtype of ``out_dtype``), or a new array."""
    odt = _out_dtype(out_dtype)
    if out is None:
        return cp.empty(shape, odt)
    if out.shape != shape or out.dtype != odt or not out.flags.c_contiguous:
        raise ValueError(f"out for out_dtype={out_dtype!r} must be a C-contiguous {shape} array of {odt}, "
                         f"got {out.dtype} {out.shape}")
    return out


def _empty_product(out, K) -> bool:
    """True (``out`` final) when there is nothing to multiply: no outputs, or K = 0 (zeros)."""
    if out.size and K == 0:
        out[...] = 0
    return out.size == 0 or K == 0


def gemm(a, b, fmt_a, fmt_b=None, *, scale_a=1.0, scale_b=1.0, scaling="tensor", layout="nt",
         out_dtype="float32", out=None, kernel="auto"):
    """Scaled matrix product of 8-bit code matrices (CuPy uint8).

    Parameters
    ----------
    a : (M, K) uint8 codes of ``fmt_a``.
    b : codes of ``fmt_b`` (default ``fmt_a``): (N, K) for ``layout="nt"`` (``C = A B^T``) or
        (K, N) for ``layout="nn"`` (``C = A B``). Row-major (a row stride is allowed).
    scaling : "tensor" (scalars), "row_col" (``scale_a`` of shape (M,), ``scale_b`` (N,)) or "block"
        (``scale_a`` (M, ceil(K/128)) for 1x128 blocks of A; ``scale_b`` (ceil(N/128), ceil(K/128))
        for 128x128 blocks of B, in the (N, K) orientation whatever the layout). Block partial sums
        are promoted into the fp32 accumulator every 128 K-elements.
    out_dtype : "float32", "float16" or "bfloat16" (bfloat16 comes back as uint16 bit patterns).
    kernel : "auto" (wgmma on sm_90, else mma.sync), "wgmma" or "mma". :data:`last_kernel` says
        which ran.

    Returns
    -------
    (M, N) CuPy array.
    """
    import cupy as cp

    global last_kernel
    key = _gemm_fast_key(cp, a, b, fmt_a, fmt_b, scale_a, scale_b, scaling, layout, out_dtype, out, kernel)
    hit = None if key is None else _gemm_fast.get(key)
    if hit is not None:   # a repeat of a checked call: its launches, its device scales
        launches, name, sa, sb = hit
        _run(launches, a, b, out, scale_a if sa is None else sa, scale_b if sb is None else sb)
        last_kernel = name
        return out
    fa = get_format(fmt_a)
    fb = get_format(fmt_b if fmt_b is not None else fmt_a)
    _check_choices(scaling, out_dtype)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNELS)}")
    a, b = _as_cupy(a), _as_cupy(b)
    for name, x in (("a", a), ("b", b)):
        if x.dtype != cp.uint8 or x.ndim != 2:
            raise TypeError(f"{name} must be a 2-D uint8 CuPy array of codes, got {x.dtype} {x.shape}")
        if x.strides[1] != 1:
            raise ValueError(f"{name} must be row-major (unit stride along its last axis)")
    M, K = a.shape
    N, Kb = (b.shape if layout == "nt" else b.shape[::-1])
    if Kb != K:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape} ({layout})")
    kb = -(-K // BLOCK)
    if scaling == "tensor":
        sa, sb = _scale(scale_a, (1,), "scale_a"), _scale(scale_b, (1,), "scale_b")
    elif scaling == "row_col":
        sa, sb = _scale(scale_a, (M,), "scale_a"), _scale(scale_b, (N,), "scale_b")
    else:
        sa, sb = _scale(scale_a, (M, kb), "scale_a"), _scale(scale_b, (-(-N // BLOCK), kb), "scale_b")
    out = _output(out, (M, N), out_dtype, cp)
    if _empty_product(out, K):
        last_kernel = None
        return out
    if kernel == "wgmma" or (kernel == "auto" and _wgmma_ok()):
        plan = []
        last_kernel = _wgmma_call(a, b, fa, fb, sa, sb, scaling, layout, out_dtype, out, kb, cp, plan_out=plan)
        if plan and key is not None:
            _gemm_fast.put(key, plan[0] + (None if isinstance(scale_a, cp.ndarray) else sa,
                                           None if isinstance(scale_b, cp.ndarray) else sb))
        return out
    ta, tb = _f16_table(fa), _f16_table(fb)
    k = _loader.kernel("gemm.cu", _instance(layout, scaling, out_dtype))
    grid = (-(-N // _TILE[1]), -(-M // _TILE[0]))
    k(grid, (256,), (a, b, out, np.int32(M), np.int32(N), np.int32(K), np.int32(a.strides[0]),
                     np.int32(b.strides[0]), np.int32(N), ta, tb, sa, sb, np.int32(kb)))
    last_kernel = "mma"
    return out


#: gemm's launch plans keyed on its raw arguments, as gemm_fused's (_fused_fast): calls with
#: ``out`` given, host-number scales ("tensor" scaling) or float32 C-contiguous device scales
#: (used as given, so their address is the plan's)
_gemm_fast = BoundedCache(256)


def _array_key(cp, x):
    """An array's part of a raw-argument plan key (None for None); TypeError for a non-CuPy
    argument (the call then takes the checked path)."""
    if x is None:
        return None
    if not isinstance(x, cp.ndarray):
        raise TypeError
    return x.data.ptr, x.shape, x.strides, x.dtype.char


def _scale_key(cp, x, number_ok: bool, device_ok: bool):
    """A scale's part of a raw-argument plan key: a plain number by value (where ``number_ok``),
    a device array by address (where ``device_ok``: the plan uses it as given); TypeError else."""
    if isinstance(x, _SCALAR) and not isinstance(x, bool):
        if number_ok:
            return float(x), type(x)
        raise TypeError
    if not device_ok:
        raise TypeError
    return _array_key(cp, x)


def _gemm_fast_key(cp, a, b, fmt_a, fmt_b, scale_a, scale_b, scaling, layout, out_dtype, out, kernel):
    """The raw-argument key of a gemm call, or None where the call is not eligible."""
    def scale(x):   # device scales only as the plan uses them: float32, C-contiguous
        ok = isinstance(x, cp.ndarray) and x.dtype == cp.float32 and x.flags.c_contiguous
        return _scale_key(cp, x, scaling == "tensor", ok)

    if out is None:
        return None
    try:
        key = (cp.cuda.Device().id, _array_key(cp, a), _array_key(cp, b), str(fmt_a),
               None if fmt_b is None else str(fmt_b), scale(scale_a), scale(scale_b), str(scaling),
               str(layout), str(out_dtype), _array_key(cp, out),
               kernel, FUSED_DECODE, WGMMA_OVERLAP, TMA_STORE, SPLIT_K, WIDE_TILES, WIDE_FP8)
        hash(key)
        return key
    except (TypeError, AttributeError):   # not eligible; the full path checks and reports it
        return None


def transpose(x):
    """``x.T`` of a 2-D uint8 code matrix (R, C), as a (C, R) view whose rows start 16 bytes apart
    (a (C, R rounded up to 16) buffer): the K-major layout :func:`gemm` reads directly. For a
    tensor used on both sides of a training step (X in ``X W^T`` and in ``dY^T X``), transpose
    its codes once and pass them with ``layout="nt"`` rather than transposing inside every NN call.
    One ``transpose_u8`` launch (64 x 64 byte tiles through shared memory), on the current stream."""
    import cupy as cp
    x = _as_cupy(x)
    if x.dtype != cp.uint8 or x.ndim != 2 or (x.size and x.strides[1] != 1):
        raise TypeError(f"x must be a 2-D row-major uint8 CuPy array of codes, got {x.dtype} "
                        f"{x.shape}")
    R, C = x.shape
    rp = _kmajor_stride(R)
    out = cp.empty((C, rp), cp.uint8)
    if x.size:
        k, grid, block, dims = _transpose_launch(R, C, x.strides[0], rp)
        k(grid, block, (x, out) + dims)
    return out[:, :R]


def gemm_grouped(a, b, fmt_a, fmt_b=None, *, scale_a=1.0, scale_b=1.0, scaling="tensor",
                 out_dtype="float32", out=None):
    """G scaled GEMMs in one launch: ``C[g] = (A[g] * sa[g]) @ (B[g] * sb[g])^T``.

    Parameters
    ----------
    a, b : one shape: (G, M, K) uint8 codes of ``fmt_a`` and (G, N, K) codes of ``fmt_b`` (the NT
        layout). Shapes that differ: sequences (list or tuple) of G 2-D arrays, ``a[g]`` (M_g, K_g)
        and ``b[g]`` (N_g, K_g), row-major (a row stride is allowed).
    scale_a, scale_b : per GEMM. One shape: those of :func:`gemm` with a leading G: "tensor" a
        scalar (every GEMM) or (G,); "row_col" (G, M) and (G, N); "block" (G, M, ceil(K/128)) and
        (G, ceil(N/128), ceil(K/128)). Sequences of arrays: a scalar (every GEMM, "tensor" only)
        or a sequence of G scales, each in the shape :func:`gemm` takes for that GEMM.
    out_dtype, out : as :func:`gemm`. One shape: ``out`` is (G, M, N). Sequences: ``out`` is
        None or a sequence of G C-contiguous (M_g, N_g) arrays.

    Returns
    -------
    ``out``: one (G, M, N) array, or a list of G (M_g, N_g) arrays (views of one buffer when
    ``out`` is None).

    Same arithmetic as G calls of :func:`gemm` (the same kernel, its tiles spread over all G
    GEMMs), except where such a call would split K (few output tiles and K >= 2048, see
    :data:`SPLIT_K`): the grouped launch never splits. Shapes that differ: each GEMM has its own
    tensor maps and a row of a table the kernel reads to find the GEMM of a tile; e4m3/e5m2 pairs
    run in one launch, other formats are decoded to fp16 first (one decode launch per operand).
    On a GPU without wgmma (not sm_90) it runs G calls of :func:`gemm`.
    """
    import cupy as cp

    global last_kernel
    fa = get_format(fmt_a)
    fb = get_format(fmt_b if fmt_b is not None else fmt_a)
    _check_choices(scaling, out_dtype)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return _grouped_ragged(a, b, fa, fb, scale_a, scale_b, scaling, out_dtype, out, cp)
    a, b = _as_cupy(a), _as_cupy(b)
    for name, x in (("a", a), ("b", b)):
        if x.dtype != cp.uint8 or x.ndim != 3:
            raise TypeError(f"{name} must be a 3-D (G, rows, K) uint8 CuPy array of codes, got "
                            f"{x.dtype} {x.shape}")
    G, M, K = a.shape
    if b.shape[0] != G or b.shape[2] != K:
        raise ValueError(f"a is (G, M, K) = {a.shape}; b must be (G, N, K) with the same G and K, "
                         f"got {b.shape}")
    N = b.shape[1]
    kb = -(-K // BLOCK)
    shapes = {"tensor": ((G,), (G,)), "row_col": ((G, M), (G, N)),
              "block": ((G, M, kb), (G, -(-N // BLOCK), kb))}[scaling]

    def scales(s, shape, name):
        if scaling == "tensor" and isinstance(s, (int, float, np.floating, np.integer)):
            return cp.full(shape, np.float32(s), cp.float32)
        s = cp.ascontiguousarray(cp.asarray(s, dtype=cp.float32))
        if s.shape != shape:
            raise ValueError(f"{name} must have shape {shape} for {scaling} scaling, got {s.shape}")
        return s.reshape(-1)

    sa, sb = scales(scale_a, shapes[0], "scale_a"), scales(scale_b, shapes[1], "scale_b")
    out = _output(out, (G, M, N), out_dtype, cp)
    if _empty_product(out, K):
        last_kernel = None
        return out
    if not _wgmma_ok():
        sa2 = sa.reshape(shapes[0])
        sb2 = sb.reshape(shapes[1])
        for g in range(G):   # gemm's scale shapes: those above without the G ((1,) per tensor)
            gemm(a[g], b[g], fa.name, fb.name, scale_a=sa2[g].reshape(shapes[0][1:] or (1,)),
                 scale_b=sb2[g].reshape(shapes[1][1:] or (1,)), scaling=scaling,
                 out_dtype=out_dtype, out=out[g])
        return out
    a2 = cp.ascontiguousarray(a).reshape(G * M, K)
    b2 = cp.ascontiguousarray(b).reshape(G * N, K)
    last_kernel = _wgmma_call(a2, b2, fa, fb, sa, sb, scaling, "nt", out_dtype, out, kb, cp, G)
    return out


def _ragged_table(rows) -> np.ndarray:
    """gemm_wgmma's ``gtab`` for GEMMs of different shapes: ``rows`` holds per GEMM (M, N, K, ldc,
    C's address, sa's address, sb's address). 16 int32 words per GEMM (M, N, K, ldc, the three
    addresses as 64-bit words, ceil(K/128)), then each GEMM's first tile and the total. A GEMM
    with no output or K = 0 gets no tiles (the caller writes its zeros)."""
    G = len(rows)
    t = np.zeros(16 * G + G + 1, np.int32)
    start = 0
    for g, (M, N, K, ldc, c, pa, pb) in enumerate(rows):
        r = t[16 * g:16 * g + 16]
        r[:4] = (M, N, K, ldc)
        r[4:10] = np.array([c, pa, pb], np.uint64).view(np.int32)
        r[10] = -(-K // BLOCK)
        t[16 * G + g] = start
        if M and N and K:
            start += (-(-M // 128)) * (-(-N // 128))
        if start >= 2 ** 31:
            raise ValueError(f"more than 2^31 - 1 output tiles of 128 x 128 in one grouped launch "
                             f"(by GEMM {g}); split the group")
    t[16 * G + G] = start
    return t


def _grouped_ragged(a, b, fa, fb, scale_a, scale_b, scaling, out_dtype, out, cp):
    """:func:`gemm_grouped` on sequences of operands whose shapes may differ."""
    global last_kernel
    if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)) or len(a) != len(b):
        raise TypeError("a and b must both be 3-D arrays (GEMMs of one shape) or sequences of the "
                        f"same length of 2-D arrays (shapes may differ); got {type(a).__name__} "
                        f"and {type(b).__name__}")
    G = len(a)
    if G == 0:
        raise ValueError("gemm_grouped needs at least one GEMM; got empty sequences")
    a, b = [_as_cupy(x) for x in a], [_as_cupy(x) for x in b]
    for name, xs in (("a", a), ("b", b)):
        for g, x in enumerate(xs):
            if x.dtype != cp.uint8 or x.ndim != 2:
                raise TypeError(f"{name}[{g}] must be a 2-D uint8 CuPy array of codes, got {x.dtype} {x.shape}")
            if x.size and x.strides[1] != 1:
                raise ValueError(f"{name}[{g}] must be row-major (unit stride along its last axis)")
    for g in range(G):
        if a[g].shape[1] != b[g].shape[1]:
            raise ValueError(f"GEMM {g}: a[{g}] is {a[g].shape} (M, K), b[{g}] must be (N, K) with the "
                             f"same K, got {b[g].shape}")
    shapes = [(x.shape[0], y.shape[0], x.shape[1]) for x, y in zip(a, b)]

    def scales(s, name):
        if not isinstance(s, (list, tuple)):
            if scaling != "tensor":
                raise ValueError(f"{name} must be a sequence of {G} per-GEMM scales for {scaling} "
                                 "scaling (one scalar serves every GEMM only for tensor scaling)")
            return [_scale(s, (1,), name)] * G
        if len(s) != G:
            raise ValueError(f"{name} must hold one scale per GEMM ({G}), got {len(s)}")
        out_ = []
        for g, (M, N, K) in enumerate(shapes):
            kb = -(-K // BLOCK)
            shape = {"tensor": ((1,), (1,)), "row_col": ((M,), (N,)),
                     "block": ((M, kb), (-(-N // BLOCK), kb))}[scaling][name == "scale_b"]
            out_.append(_scale(s[g], shape, f"{name}[{g}]"))
        return out_

    sa, sb = scales(scale_a, "scale_a"), scales(scale_b, "scale_b")
    if out is None:   # one buffer; each GEMM's output 128-byte aligned (TMA stores)
        odt = _out_dtype(out_dtype)
        step = 128 // odt.itemsize
        offs = np.cumsum([0] + [-(-M * N // step) * step for M, N, _ in shapes])
        flat = cp.empty(int(offs[-1]), odt)
        out = [flat[offs[g]:offs[g] + M * N].reshape(M, N) for g, (M, N, _) in enumerate(shapes)]
    else:
        if not isinstance(out, (list, tuple)) or len(out) != G:
            raise ValueError(f"out must be None or a sequence of {G} arrays (one per GEMM)")
        out = [_output(_as_cupy(o), (M, N), out_dtype, cp) for o, (M, N, _) in zip(out, shapes)]
    for g, (M, N, K) in enumerate(shapes):
        _empty_product(out[g], K)
    if not any(M and N and K for M, N, K in shapes):
        last_kernel = None
        return out
    if not _wgmma_ok():
        for g, (M, N, K) in enumerate(shapes):
            if M and N and K:
                gemm(a[g], b[g], fa.name, fb.name, scale_a=sa[g], scale_b=sb[g], scaling=scaling,
                     out_dtype=out_dtype, out=out[g])
        return out
    key = (cp.cuda.Device().id, fa.name, fb.name, scaling, out_dtype, TMA_STORE, WGMMA_OVERLAP,
           tuple((x.data.ptr, x.shape, x.strides[0]) for x in a + b + out),
           tuple(x.data.ptr for x in sa + sb))
    plan = _plans.get(key)
    if plan is None:
        plan, replay = _ragged_plan(a, b, fa, fb, sa, sb, shapes, scaling, out_dtype, out, cp)
        # a plan that cannot be replayed is still held (under a key no call asks for) so that the
        # pinned staging of its tensor maps outlives the asynchronous copy, as _tmaps' do
        _plans.put(key if replay else ("once", next(_once)), plan)
    launches, last_kernel, _ = plan
    for k, grid, block, args, smem in launches:
        k(grid, block, args, shared_mem=smem)
    return out


_once = itertools.count()


def _ragged_plan(a, b, fa, fb, sa, sb, shapes, scaling, out_dtype, out, cp):
    """((launches, kernel name, what they use), replayable) of :func:`_grouped_ragged`: the
    launches take fixed arguments. FP8 pairs read the caller's codes, or a padded copy made here
    where a row stride needs one (then not replayable: the copy is not a launch of the plan);
    other formats read fp16 buffers of the plan written by its decode launches."""
    G = len(shapes)
    fp8 = fa.name in _FP8_HW and fb.name in _FP8_HW
    launches = []
    # each GEMM's operands as the kernel reads them: the codes (or a padded copy), or fp16
    operand = ((lambda x, f: _k_major(x, 1, cp, None)) if fp8 else
               (lambda x, f: _decode_f16(x, f, cp, None, launches)))
    live = [g for g, (M, N, K) in enumerate(shapes) if M and N and K]
    a2 = {g: operand(a[g], fa) for g in live}
    b2 = {g: operand(b[g], fb) for g in live}
    replay = not fp8 or all(a2[g] is a[g] and b2[g] is b[g] for g in live)
    es = 1 if fp8 else 2
    cmap = (TMA_STORE and out_dtype != "float32"
            and all(out[g].data.ptr % 16 == 0 and (shapes[g][1] * 2) % 16 == 0 for g in live))
    # every GEMM's maps: A's, then B's, then C's; a GEMM without tiles gets a live one's
    ref = live[0]
    src = [g if g in a2 else ref for g in range(G)]
    tm = lambda x: _tmap_bytes(x.data.ptr, x.shape[0], x.shape[1], x.strides[0], es)
    maps = (b"".join(tm(a2[h]) for h in src) + b"".join(tm(b2[h]) for h in src)
            + (b"".join(_cmap_bytes(out[h], shapes[h][0], shapes[h][1], 1) for h in src) if cmap else b""))
    rows = [(M, N, K, N, out[g].data.ptr, sa[g].data.ptr, sb[g].data.ptr) if g in a2 else (0, 0, 0, 0, 0, 0, 0)
            for g, (M, N, K) in enumerate(shapes)]
    tab = _ragged_table(rows)
    dmaps, pm = _upload(maps, cp)
    dtab, pt = _upload(tab.tobytes(), cp)
    keep = [dmaps, pm, dtab, pt, a2, b2]
    ta, tb = (_FP8_HW[fa.name], _FP8_HW[fb.name]) if fp8 else (2, 2)
    k = _loader.kernel("gemm_wgmma.cu", _wg_instance(ta, tb, scaling, out_dtype))
    smem = _wg_smem(es, _STAGES[es], cmap)
    if k.max_dynamic_shared_size_bytes < smem:
        k.max_dynamic_shared_size_bytes = smem
    tiles = int(tab[-1])
    z = np.int32(0)
    launches.append((k, (min(tiles, _sm_count()),), (_WG_THREADS,),
                     (dmaps, _NULL, z, z, z, z, sa[ref], sb[ref], z, np.int32(G), np.int32(cmap),
                      np.int32(1), _NULL, dtab) + _NO_FUSION, smem))
    # `keep`: what the launches' arguments point into, alive as long as the plan
    return (launches, ("wgmma-fp8" if fp8 else "wgmma-f16"), keep), replay


# --- fused quantize-on-load and epilogue ----------------------------------------------------------

_QA = {"float32": 3, "float16": 2, "bfloat16": 1}   # gemm_wgmma's QA per high-precision input
_QA_ONCE = 4   # added to QA: converted once before the GEMM (QONCE in gemm_wgmma.cu), not in the producer
_QA_MODES = (0,) + tuple(sorted(_QA.values())) + tuple(q + _QA_ONCE for q in sorted(_QA.values()))
#: quantize-on-load: A is converted once, before the GEMM, when C has at least this many tile
#: columns (converting in the producer repeats the conversion once per tile column; at 2 columns
#: it wins only for power-of-two scales, which a scale held on the device does not tell the host)
QA_ONCE_MIN_TILES_N = 2
# quantize-on-load in the producer: stage-ring depth and the staging of A (QA_RAW passes of 16 KB
# in gemm_wgmma.cu) that share the shared memory with it and with C's staging
_QA_STAGES = 4
_QA_RAW_BYTES = 4 * 16384
_QA_NB = 4   # 16-byte chunks of A per thread loaded at once by the convert-once phase (QA_NB there)


def _qa_chunks() -> int:
    """16-byte chunks a convert-once unit holds at least: half a block of loads of its 384
    threads (read at call time: benchmarks comparing builds of another QA_NB set _QA_NB)."""
    return _QA_NB // 2 * _WG_THREADS


def _qa_codes(M: int, K: int, cp):
    """The code buffer a converted-once quantize-on-load writes A's codes into (an M x K view of a
    workspace with TMA's row stride; it keeps the last call's codes of that shape)."""
    return _workspace("qcodes", M, _kmajor_stride(K), cp.uint8, cp)[:, :K]


def _qa_parts(M: int, K: int, itemsize: int) -> int:
    """Units per 128-row tile row of the quantize-on-load phase (``qparts`` in gemm_wgmma.cu): the
    most, as a power of two up to 128, that leaves each unit at least :func:`_qa_chunks` chunks
    (so that a unit is between half a block and a block of loads per thread), so that many CTAs
    share the conversion."""
    cpr, least = -(-K * itemsize // 16), _qa_chunks()
    parts = 1
    while parts < 128 and (128 // (2 * parts)) * cpr >= least:
        parts *= 2
    return parts


@functools.lru_cache(maxsize=None)
def _cvt_params(f, sat: bool):
    """(special, packed codes) of fp8_cvt.cuh's conversion to format ``f`` (e4m3 / e5m2): the
    first magnitude left to the fix-up, and NaN+ | NaN- << 8 | overflow+ << 16 | overflow- << 24
    from the format's declared special codes."""
    from .. import _kernels as K
    from ..codecs import _encoder_params
    from .codecs import cvt_special
    codes = _encoder_params(f)[-1]
    c = [int(codes[getattr(K, f"C_{n}")]) for n in ("NAN_POS", "NAN_NEG", "OVF_POS", "OVF_NEG")]
    return np.uint32(cvt_special(f, sat)), np.uint32(c[0] | c[1] << 8 | c[2] << 16 | c[3] << 24)


def _fused_scale(s, name, check, cp):
    """A (1,) float32 device scale: host numbers checked and kept as cached device scalars; device
    arrays checked unless ``check`` is False (a host round trip)."""
    from .quantize import _device_scale
    return _device_scale(cp, s, check, name, host=lambda v: _scale(v, (1,), name))


@functools.lru_cache(maxsize=None)
def _composed_kernels():
    """float32 ``y + b`` rounded once (``add.rn.f32``, subnormals kept) and ReLU on float32 bits
    (below zero, -Inf included, to +0; -0 and NaN kept), for :func:`_fused_composed`."""
    import cupy as cp
    add = cp.ElementwiseKernel("float32 y, float32 b", "float32 z",
                               'asm("add.rn.f32 %0, %1, %2;" : "=f"(z) : "f"(y), "f"(b));',
                               "fp8lab_add_f32")
    relu = cp.ElementwiseKernel("uint32 u", "uint32 v",
                                "const unsigned int m = u & 0x7FFFFFFFu; "
                                "v = (u >> 31) && m != 0u && m <= 0x7F800000u ? 0u : u;",
                                "fp8lab_relu_bits")
    return add, relu


@functools.lru_cache(maxsize=None)
def _bf16_kernel():
    import cupy as cp
    return cp.ElementwiseKernel(
        "uint32 u", "uint16 h",
        "h = (u & 0x7FFFFFFFu) > 0x7F800000u ? (unsigned short)((u >> 16) | 0x7FFFu)"
        " : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)", "fp8lab_f32_to_bf16")


def _to_bf16_bits(y, cp):
    """float32 -> bfloat16 bit patterns (uint16), nearest even; NaN -> 0x7FFF with its sign."""
    return _bf16_kernel()(y.view(cp.uint32))


def gemm_fused(a, b, fmt_a, fmt_b=None, *, scale_a=1.0, scale_b=1.0, bias=None, relu=False,
               out_dtype="bfloat16", out_scale=None, saturate=None, out_saturate=None, amax_a=None,
               amax_out=None, bfloat16=False, out=None, check=True, kernel="auto"):
    """One layer's GEMM with its casts fused: ``C = act(decode(quantize(A)) sa @ (decode(B) sb)^T + bias)``.

    The cast of a high-precision A into 8 bits happens inside the GEMM's launch (quantize-on-load:
    with at least QA_ONCE_MIN_TILES_N tile columns the CTAs first convert A once into an L2-resident
    code buffer, each tile row's GEMM starting when its rows are done; otherwise the producer
    warpgroup converts each tile as it brings it into shared memory), and the bias, ReLU, the cast
    of the output to 8 bits and the maximum for the next layer's scale happen in its epilogue: no
    separate kernel over A or C. Calls that convert once share a code buffer and counters per
    shape: run them on one stream (as :func:`gemm`'s workspaces).

    Parameters
    ----------
    a : (M, K) CuPy array: float32, float16, bfloat16 bits (uint16 with ``bfloat16=True``),
        quantized on load at ``scale_a`` into ``fmt_a``; or uint8 codes of ``fmt_a`` (no cast).
        Rows may be strided (unit stride along K).
    b : (N, K) uint8 codes of ``fmt_b`` (default ``fmt_a``), K-major (the NT layout of :func:`gemm`).
    fmt_a, fmt_b : "e4m3" or "e5m2".
    scale_a, scale_b : per-tensor scales, numbers or one-element float32 CuPy arrays (read on the
        device: with delayed scaling the scale never visits the host). ``a ~= decode(codes) * scale_a``.
    bias : optional (N,) float32 CuPy array added to every row (after the scales; its own rounding).
    relu : apply ``x < 0 ? +0 : x`` (NaN and -0 pass) after the bias.
    out_dtype : "bfloat16" (uint16 bit patterns), "float16", "float32", or "e4m3" / "e5m2": the
        codes of C at ``out_scale`` (required then), ``out_saturate`` as :func:`fp8lab.quantize`'s
        ``saturate`` (default per format).
    saturate : saturation of the quantize-on-load (default as :func:`fp8lab.quantize`). Rounding is
        nearest even (for other modes quantize first, for example with
        :func:`fp8lab.gpu.quantize.cast_transpose`, and pass the codes).
    amax_a, amax_out : optional (1,) float32 CuPy arrays, updated in place to the maximum of
        themselves and the maximum finite ``|A|`` (high-precision A only) / ``|C|`` (before an
        8-bit cast): the delayed-scaling history of this layer's input and of the next layer's.
    check : validate device scales (finite, > 0) at the cost of a host round trip; pass False
        under CUDA graph capture.
    kernel : "auto" (the fused wgmma kernel on sm_90, else the composition below), "fused" or
        "composed".

    Returns
    -------
    (M, N) CuPy array (``out`` if given).

    Guarantees: the codes A is multiplied with are those of
    ``fp8lab.quantize(A, fmt_a, scales=scale_a, rounding="nearest_even", saturate=saturate)``, and
    C is what :func:`gemm` of those codes gives in float32, plus ``bias`` in float32, ReLU, then
    rounded once to ``out_dtype`` (8-bit outputs: ``fp8lab.quantize(C, out_dtype, scales=out_scale)``).
    The composed route (``kernel="composed"``: :func:`fp8lab.gpu.quantize.cast_transpose`,
    :func:`gemm`, CuPy element-wise operations) computes exactly that and is what other GPUs run;
    the fused kernel equals it bit for bit where :func:`gemm` does not split K (checked by
    ``benchmarks/gpu_fused.py --check`` and ``tests/test_gpu_fused.py``). The fused kernel never
    splits K. Speed: ``docs/gpu.md`` (with a power-of-two ``scale_a`` the cast is one multiply per
    element).
    """
    import cupy as cp

    global last_kernel
    if out is None and out_dtype in FUSED_OUT and isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray) \
            and a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[1]:
        out = cp.empty((a.shape[0], b.shape[0]), _out_dtype(out_dtype))
    key = _fused_fast_key(cp, a, b, fmt_a, fmt_b, scale_a, scale_b, bias, relu, out_dtype, out_scale,
                          saturate, out_saturate, amax_a, amax_out, bfloat16, out, check, kernel)
    hit = None if key is None else _fused_fast.get(key)
    if hit is not None:   # a repeat of a checked call: its launches, its device scales
        launches, sa, sb = hit
        _run(launches, a, b, out, scale_a if sa is None else sa, scale_b if sb is None else sb)
        last_kernel = "wgmma-fused"
        return out
    out, launches, sa, sb = _gemm_fused(cp, a, b, fmt_a, fmt_b, scale_a, scale_b, bias, relu, out_dtype,
                                        out_scale, saturate, out_saturate, amax_a, amax_out, bfloat16,
                                        out, check, kernel)
    if launches is not None and key is not None:
        _fused_fast.put(key, (launches, None if isinstance(scale_a, cp.ndarray) else sa,
                              None if isinstance(scale_b, cp.ndarray) else sb))
    return out


#: gemm_fused's launch plans keyed on its raw arguments (pointers, shapes, strides, dtypes and
#: values): a repeated call skips the argument checks and resolution, which cost more host time
#: than the launch. Only calls whose checked plan was stored (_plans) enter; device scales only
#: with check=False (a checked device scale is read on every call).
_fused_fast = BoundedCache(256)
_SCALAR = (int, float, np.floating, np.integer)


def _forget_plans() -> None:
    """Drop every cached launch plan (:data:`_plans` and both raw-argument caches), so that the
    next calls fetch their kernels from the loader again (benchmarks that swap builds of a kernel
    source need this: a plan holds its kernel function). Fresh caches of the same limits, not
    ``evict()``: entries kept for captured CUDA graphs go too, so a graph captured before must not
    be replayed after."""
    global _plans, _gemm_fast, _fused_fast
    _plans, _gemm_fast, _fused_fast = (BoundedCache(c.limit) for c in (_plans, _gemm_fast, _fused_fast))


def _fused_fast_key(cp, a, b, fmt_a, fmt_b, scale_a, scale_b, bias, relu, out_dtype, out_scale,
                    saturate, out_saturate, amax_a, amax_out, bfloat16, out, check, kernel):
    """The raw-argument key of a gemm_fused call, or None where the call is not eligible (an
    argument that is neither a CuPy array nor a plain number or string, or a device scale read
    for checking)."""
    arr = functools.partial(_array_key, cp)

    def scale(x):   # a checked device scale is read on every call
        return _scale_key(cp, x, True, not check)

    try:
        key = (cp.cuda.Device().id, arr(a), arr(b), str(fmt_a), None if fmt_b is None else str(fmt_b),
                scale(scale_a), scale(scale_b), arr(bias), bool(relu), str(out_dtype),
                None if out_scale is None else scale(out_scale), saturate, out_saturate, arr(amax_a),
                arr(amax_out), bool(bfloat16), arr(out), kernel, TMA_STORE, QA_ONCE_MIN_TILES_N)
        hash(key)
        return key
    except (TypeError, AttributeError):   # not eligible; the full path checks and reports it
        return None


def _gemm_fused(cp, a, b, fmt_a, fmt_b, scale_a, scale_b, bias, relu, out_dtype, out_scale, saturate,
                out_saturate, amax_a, amax_out, bfloat16, out, check, kernel):
    """gemm_fused's checks, resolution and launches: (the output, the launch list where it was
    stored for replay (else None), the device scales it ran with)."""
    from .quantize import _amax_buffer, _resolve_cast_args

    global last_kernel
    fa = get_format(fmt_a)
    fb = get_format(fmt_b if fmt_b is not None else fmt_a)
    for name, f in (("fmt_a", fa), ("fmt_b", fb)):
        if f.name not in _FP8_HW:
            raise ValueError(f"gemm_fused multiplies e4m3 / e5m2 codes on FP8 tensor cores; {name} is "
                             f"{f.name!r} (use gemm for other formats)")
    if out_dtype not in FUSED_OUT:
        raise ValueError(f"unknown out_dtype {out_dtype!r}; known: {', '.join(FUSED_OUT)}")
    if kernel not in ("auto", "fused", "composed"):
        raise ValueError(f"unknown kernel {kernel!r}; known: auto, fused, composed")
    a, b = _as_cupy(a), _as_cupy(b)
    if bfloat16:
        if a.dtype != cp.uint16:
            raise TypeError(f"bfloat16=True needs a as uint16 bit patterns, got {a.dtype}")
        kind = "bfloat16"
    elif a.dtype == cp.uint8:
        kind = "codes"
    elif a.dtype in (cp.float32, cp.float16):
        kind = a.dtype.name
    else:
        raise TypeError(f"a must be float32, float16, bfloat16 bits (uint16, bfloat16=True) or uint8 "
                        f"codes, got {a.dtype}")
    if a.ndim != 2 or (a.size and (a.strides[1] != a.itemsize or a.strides[0] < 0)):
        raise ValueError(f"a must be 2-D with unit stride along K and rows in order, got shape {a.shape}, "
                         f"strides {a.strides}")
    if b.dtype != cp.uint8 or b.ndim != 2 or (b.size and b.strides[1] != 1):
        raise TypeError(f"b must be a 2-D row-major (N, K) uint8 CuPy array of codes, got {b.dtype} "
                        f"{b.shape}")
    M, K = a.shape
    N = b.shape[0]
    if b.shape[1] != K:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape} (b must be (N, K))")
    sat_a = _resolve_cast_args(fa, "nearest_even", saturate)[4] if kind != "codes" else False
    sa = _fused_scale(scale_a, "scale_a", check, cp)
    sb = _fused_scale(scale_b, "scale_b", check, cp)
    fo = so = sat_o = None
    if out_dtype in ("e4m3", "e5m2"):
        if out_scale is None:
            raise ValueError(f"out_dtype={out_dtype!r} needs out_scale (C ~= decode(codes) * out_scale)")
        fo = get_format(out_dtype)
        sat_o = _resolve_cast_args(fo, "nearest_even", out_saturate)[4]
        so = _fused_scale(out_scale, "out_scale", check, cp)
    elif out_scale is not None or out_saturate is not None:
        raise ValueError(f"out_scale and out_saturate apply to 8-bit outputs, not {out_dtype!r}")
    if bias is not None:
        bias = _as_cupy(bias)
        if bias.dtype != cp.float32 or bias.shape != (N,):
            raise TypeError(f"bias must be a ({N},) float32 CuPy array, got {bias.dtype} {bias.shape}")
        bias = cp.ascontiguousarray(bias)
    amax_a = _amax_buffer(cp, amax_a, "amax_a")
    amax_out = _amax_buffer(cp, amax_out, "amax_out")
    if amax_a is not None and kind == "codes":
        raise ValueError("amax_a is measured while quantizing A; a is already codes")
    out = _output(out, (M, N), out_dtype, cp)
    if out.size == 0:
        last_kernel = None
        return out, None, sa, sb
    fused = kernel == "fused" or (kernel == "auto" and _wgmma_ok())
    if not fused or K == 0:
        last_kernel = "composed"
        return _fused_composed(a, b, fa, fb, kind, sa, sb, bias, relu, out_dtype, fo, so,
                               sat_a, sat_o, amax_a, amax_out, out, cp), None, sa, sb
    key = ("fused", cp.cuda.Device().id, a.data.ptr, a.shape, a.strides, kind, b.data.ptr, b.shape,
           b.strides, fa.name, fb.name, sa.data.ptr, sb.data.ptr, sat_a,
           None if bias is None else bias.data.ptr, bool(relu), out_dtype, out.data.ptr,
           None if so is None else (so.data.ptr, sat_o),
           None if amax_a is None else amax_a.data.ptr, None if amax_out is None else amax_out.data.ptr,
           TMA_STORE, QA_ONCE_MIN_TILES_N)
    launches = _plans.get(key)
    stored = launches is not None
    if not stored:
        launches, stored = _fused_launches(a, b, fa, fb, kind, sa, sb, bias, relu, out_dtype, fo, so,
                                           sat_a, sat_o, amax_a, amax_out, out, cp)
        if stored:
            _plans.put(key, launches)
    _run(launches, a, b, out, sa, sb)
    last_kernel = "wgmma-fused"
    return out, launches if stored else None, sa, sb


def _fused_launches(a, b, fa, fb, kind, sa, sb, bias, relu, out_dtype, fo, so, sat_a, sat_o,
                    amax_a, amax_out, out, cp):
    """The launch list of one fused call, and whether it can be replayed: not when A (or B) had to
    be copied here into a padded buffer (TMA and the quantize-on-load's 16-byte copies need
    aligned rows); such a call rebuilds its launches, and its copy, every time."""
    M, K = a.shape
    N = b.shape[0]
    ta, tb = _FP8_HW[fa.name], _FP8_HW[fb.name]
    b2 = _k_major(b, 1, cp, "pb")
    qa = 0 if kind == "codes" else _QA[kind]
    once = qa != 0 and -(-N // 128) >= QA_ONCE_MIN_TILES_N
    tiles_m = -(-M // 128)
    xa = qsync = None
    if qa == 0:
        a2 = _k_major(a, 1, cp, "pa")
    else:   # quantize-on-load: A read as is, or a copy
        xa = _k_major(a, a.itemsize, cp, "qa", whole_rows=True)
        a2 = b2   # in the producer: A's tensor map is not used (b2's stands in)
    if once:   # its codes written into a2 (A's map), units counted in qsync
        qa += _QA_ONCE
        a2 = _qa_codes(M, K, cp)
        qsync = _workspace("qsync", 1, 2 + tiles_m, cp.uint32, cp)   # zeros between launches
    cmap = (TMA_STORE and out_dtype in ("bfloat16", "float16") and out.data.ptr % 16 == 0
            and (N * 2) % 16 == 0)
    maps = _tmaps(a2, b2, 1, (out, M, N, 1) if cmap else None)
    k = _loader.kernel("gemm_wgmma.cu", _fused_instance(ta, tb, out_dtype, qa))
    if 0 < qa < _QA_ONCE:   # ring, C's staging (always reserved: A's staging sits behind it), A's staging
        smem = _wg_smem(1, _QA_STAGES, True) + _QA_RAW_BYTES
    else:
        smem = _wg_smem(1, _STAGES[1], cmap)
    if k.max_dynamic_shared_size_bytes < smem:
        k.max_dynamic_shared_size_bytes = smem
    xspec, xcodes = _cvt_params(fa, sat_a) if qa else (np.uint32(0), np.uint32(0))
    ospec, ocodes = _cvt_params(fo, sat_o) if fo is not None else (np.uint32(0), np.uint32(0))
    x = a if xa is None else xa
    xcopy = None if xa is None or xa is a else xa   # the padded copy, or None: the call's own A
    ldx = x.strides[0] // x.itemsize if M > 1 else K
    ptr = lambda x: _NULL if x is None else x
    bits = lambda m: _NULL if m is None else m.view(cp.uint32)
    tail = (np.int64(ldx), xspec, xcodes, bits(amax_a), ptr(bias), np.int32(bool(relu)), ptr(so), ospec,
            ocodes, bits(amax_out))
    tail += ((a2, np.int32(a2.strides[0]), qsync, np.int32(_qa_parts(M, K, a.itemsize))) if once else
             (_NULL, np.int32(0), _NULL, np.int32(0)))
    dims = (np.int32(M), np.int32(N), np.int32(K), np.int32(N), np.int32(-(-K // BLOCK)), np.int32(1),
            np.int32(cmap), np.int32(1))
    tiles = tiles_m * (-(-N // 128))
    launch = (k, (min(tiles, _sm_count()),), (_WG_THREADS,),
              lambda a_, b_, out_, sa_, sb_: (maps, out_) + dims[:4] + (sa_, sb_) + dims[4:] +
              (out_, _NULL, _NULL if qa == 0 else a_ if xcopy is None else xcopy) + tail, smem)
    return [launch], b2 is b and (a2 is a if qa == 0 else xa is a)


def _fused_composed(a, b, fa, fb, kind, sa, sb, bias, relu, out_dtype, fo, so, sat_a, sat_o,
                    amax_a, amax_out, out, cp):
    """:func:`gemm_fused` as separate steps (the definition the fused kernel is checked against)."""
    from .codecs import _widen_float16
    from .quantize import cast_transpose
    if kind == "codes":
        codes = a
    else:
        x32 = ((a.astype(cp.uint32) << 16).view(cp.float32) if kind == "bfloat16"
               else _widen_float16(a, cp) if kind == "float16" else a)
        codes = cast_transpose(x32, fa, sa, rounding="nearest_even", saturate=sat_a, transpose=False,
                               amax=amax_a, check=False).q.codes
    y = gemm(codes, b, fa.name, fb.name, scale_a=sa, scale_b=sb, out_dtype="float32")
    # CuPy's own float32 kernels flush subnormals (-ftz=true): the add is written in PTX, ReLU and
    # the maximum work on the bits
    add, relu_bits = _composed_kernels()
    if bias is not None:
        y = add(y, bias[None, :])
    if relu:
        y = relu_bits(y.view(cp.uint32)).view(cp.float32)
    if fo is not None:
        out[...] = cast_transpose(y, fo, so, rounding="nearest_even", saturate=sat_o, transpose=False,
                                  amax=amax_out, check=False).q.codes
        return out
    if amax_out is not None and y.size:   # finite |y| ordered as bits; amax_out is non-negative
        mag = y.view(cp.uint32) & np.uint32(0x7FFFFFFF)
        m = cp.where(mag < np.uint32(0x7F800000), mag, np.uint32(0)).max()
        cp.maximum(amax_out.view(cp.uint32), m, out=amax_out.view(cp.uint32))
    if out_dtype == "bfloat16":
        out[...] = _to_bf16_bits(y, cp)
    else:
        out[...] = y.astype(out.dtype)
    return out
