"""GPU GEMMs against a float64 reference of the dequantized operands (skipped without a GPU)."""

import sys
from pathlib import Path

import pytest

import fp8lab.gpu

OK, WHY = fp8lab.gpu.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)


def test_gemm_all_pairs_layouts_scalings():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_gemm
    # N = 264: 16-bit outputs leave through the TMA-store epilogue (rows 16-byte aligned);
    # 200x136x4100: 4 output tiles, 33 K-tiles: split-K (8 splits) and its reduce launch
    assert gpu_gemm.check(print, shapes=((303, 300, 1000), (129, 257, 130), (1, 1, 1),
                                         (300, 264, 520), (200, 136, 4100))) == 0


def test_gemm_errors_name_what_works():
    import cupy as cp
    from fp8lab.gpu.gemm import gemm
    a = cp.zeros((4, 8), cp.uint8)
    with pytest.raises(ValueError, match="known: tensor, row_col, block"):
        gemm(a, a, "e4m3", scaling="rows")
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm(a, cp.zeros((4, 9), cp.uint8), "e4m3")


def test_gemm_mma_fallback_still_correct():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_gemm
    assert gpu_gemm.check(print, shapes=((129, 257, 130),), kernel="mma") == 0


@pytest.mark.parametrize("shape", [(1, 1), (70, 130), (8192, 13), (64, 64), (3, 200)])
def test_transpose_codes(shape):
    import cupy as cp
    from fp8lab.gpu.gemm import transpose
    x = cp.random.randint(0, 256, shape, dtype=cp.uint8)
    t = transpose(x)
    assert t.shape == shape[::-1] and t.strides[0] % 16 == 0
    assert bool((t == x.T).all())
    with pytest.raises(TypeError, match="uint8"):
        transpose(cp.zeros(shape, cp.float32))


def test_gemm_nt_on_transposed_codes_equals_nn():
    """C = A B with B (K, N): layout "nn" (transposed inside) and "nt" on transpose(B) agree bit
    for bit (same kernel, same operands)."""
    import cupy as cp
    from fp8lab.gpu.gemm import gemm, transpose
    a = cp.random.randint(0, 0x70, (300, 520), dtype=cp.uint8)
    b = cp.random.randint(0, 0x70, (520, 264), dtype=cp.uint8)
    c1 = gemm(a, b, "e4m3", layout="nn", out_dtype="bfloat16")
    c2 = gemm(a, transpose(b), "e4m3", layout="nt", out_dtype="bfloat16")
    assert bool((c1 == c2).all())


def test_dispatcher_names_the_kernel():
    import cupy as cp
    import fp8lab.gpu.gemm as GM
    a = cp.zeros((4, 32), cp.uint8)
    GM.gemm(a, a, "e4m3")
    assert GM.last_kernel in ("wgmma-fp8", "mma")
    GM.gemm(a, a, "hif8")
    assert GM.last_kernel in ("wgmma-f16", "mma")
    GM.gemm(a, a, "e4m3", kernel="mma")
    assert GM.last_kernel == "mma"
    with pytest.raises(ValueError, match="known: auto, wgmma, mma"):
        GM.gemm(a, a, "e4m3", kernel="cutlass")


def _against_exact(rng, fa, fb, scaling, unit_a=1.0, unit_b=1.0, M=70, N=130, K=300):
    """GPU C and fp8lab.gemm(accumulate="exact") (exact products, exact sum, one rounding) of the
    same codes and scales, and the float32 accumulation bound between them: FP8 tensor cores get
    the documented 2^-10 allowance, and each of the output's and the K / 128 promotions' roundings
    one float32 subnormal spacing (they matter only where C is subnormal). Scales: 0.75 / 1.5
    (tensor) or uniform in [0.5, 2) per block (block), times ``unit_a`` / ``unit_b``."""
    import cupy as cp
    import numpy as np

    import fp8lab
    from fp8lab import QTensor, Scaling
    from fp8lab.gemm import gemm as cpu_gemm
    from fp8lab.gpu.gemm import gemm

    a = fp8lab.encode(rng.standard_normal((M, K)) * 4, fa)
    b = fp8lab.encode(rng.standard_normal((N, K)) * 4, fb)
    if scaling == "tensor":
        sa, sb = np.float32([[0.75 * unit_a]]), np.float32([[1.5 * unit_b]])
        rec_a = rec_b = Scaling.per_tensor()
        ga, gb = float(sa[0, 0]), float(sb[0, 0])
    else:
        kb = -(-K // 128)
        sa = (rng.uniform(0.5, 2, (M, kb)) * unit_a).astype(np.float32)
        sb = (rng.uniform(0.5, 2, (-(-N // 128), kb)) * unit_b).astype(np.float32)
        rec_a, rec_b = Scaling.parse("block:128"), Scaling.parse("tile:128")
        ga, gb = cp.asarray(sa), cp.asarray(sb)
    qa, qb = QTensor(a, sa, fa, rec_a), QTensor(b, sb, fb, rec_b)
    exact = cpu_gemm(qa, qb, accumulate="exact", out_dtype=np.float64)
    got = gemm(cp.asarray(a), cp.asarray(b), fa, fb, scale_a=ga, scale_b=gb, scaling=scaling).get()
    mag = np.abs(qa.dequantize(np.float64)) @ np.abs(qb.dequantize(np.float64)).T
    fp8 = fa in ("e4m3", "e5m2") and fb in ("e4m3", "e5m2")
    spacing = float(np.finfo(np.float32).smallest_subnormal)
    tol = ((K + 2) * 2.0**-24 + (2.0**-10 if fp8 else 0.0)) * mag + (K // 128 + 2) * spacing
    return got.astype(np.float64), exact, tol


@pytest.mark.parametrize("fa,fb,scaling", [("e4m3", "e4m3", "tensor"), ("e5m2", "e4m3", "block"),
                                           ("hif8", "hif8", "tensor"), ("hif8", "e4m3", "block")])
def test_gemm_against_the_cpu_exact_emulation(fa, fb, scaling):
    import numpy as np
    rng = np.random.default_rng(abs(hash((fa, fb, scaling))) % 2**32)
    got, exact, tol = _against_exact(rng, fa, fb, scaling)
    assert np.isfinite(got).all()
    assert np.all(np.abs(got - exact) <= tol)


@pytest.mark.parametrize("scaling", ["tensor", "block"])
def test_gemm_keeps_float32_subnormal_outputs(scaling):
    """Scales so small that C lies below 2^-126: the products, promotions and scalings keep
    float32 subnormals, as the CPU emulation does (a kernel built to flush them gives zeros).
    Per tensor the scales' product (1.125 x 2^-139) is itself subnormal; per block each
    block's is."""
    import numpy as np
    units = (2.0**-70, 2.0**-69) if scaling == "tensor" else (2.0**-70, 2.0**-66)
    got, exact, tol = _against_exact(np.random.default_rng(7), "e4m3", "e4m3", scaling, *units)
    f32 = np.finfo(np.float32)
    assert np.median(np.abs(exact)) < f32.tiny and np.abs(exact).max() > f32.smallest_subnormal * 2**10
    assert np.all(np.abs(got - exact) <= tol)
    big = np.abs(exact) > f32.smallest_subnormal * 2**9
    assert big.any() and np.all(got[big] != 0)


def test_grouped_equals_separate_calls():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_gemm
    assert gpu_gemm.check_grouped(print, cases=((3, 130, 200, 300), (2, 1, 1, 1))) == 0


def test_grouped_shape_errors():
    import cupy as cp
    from fp8lab.gpu.gemm import gemm_grouped
    a = cp.zeros((2, 4, 8), cp.uint8)
    with pytest.raises(ValueError, match="same G and K"):
        gemm_grouped(a, cp.zeros((3, 4, 8), cp.uint8), "e4m3")
    with pytest.raises(ValueError, match=r"scale_a must have shape \(2,\)"):
        gemm_grouped(a, a, "e4m3", scale_a=cp.ones(3, cp.float32))


def test_grouped_ragged_equals_separate_calls():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_gemm
    assert gpu_gemm.check_grouped_ragged(print, pairs=(("e4m3", "e4m3"), ("e5m2", "e4m3"), ("hif8", "hif8"))) == 0


def test_grouped_ragged_errors_name_what_is_accepted():
    import cupy as cp
    from fp8lab.gpu.gemm import gemm_grouped
    a = [cp.zeros((4, 8), cp.uint8), cp.zeros((5, 16), cp.uint8)]
    b = [cp.zeros((3, 8), cp.uint8), cp.zeros((2, 16), cp.uint8)]
    with pytest.raises(ValueError, match=r"GEMM 1: a\[1\] is \(5, 16\).*same K"):
        gemm_grouped(a, [b[0], cp.zeros((2, 8), cp.uint8)], "e4m3")
    with pytest.raises(TypeError, match="sequences of the same length"):
        gemm_grouped(a, b[:1], "e4m3")
    with pytest.raises(TypeError, match=r"b\[0\] must be a 2-D uint8"):
        gemm_grouped(a, [b[0].astype(cp.int8), b[1]], "e4m3")
    with pytest.raises(ValueError, match="one scale per GEMM"):
        gemm_grouped(a, b, "e4m3", scale_a=[1.0])
    with pytest.raises(ValueError, match=r"scale_b\[1\] must have shape \(2,\)"):
        gemm_grouped(a, b, "e4m3", scaling="row_col", scale_a=[cp.ones(4), cp.ones(5)],
                     scale_b=[cp.ones(3), cp.ones(3)])
    with pytest.raises(ValueError, match="sequence of 2 per-GEMM scales for block"):
        gemm_grouped(a, b, "e4m3", scaling="block")
    with pytest.raises(ValueError, match="at least one GEMM"):
        gemm_grouped([], [], "e4m3")
    with pytest.raises(ValueError, match=r"C-contiguous \(5, 2\)"):
        gemm_grouped(a, b, "e4m3", out=[cp.zeros((4, 3), cp.float32), cp.zeros((2, 5), cp.float32)])


def test_captured_graph_survives_cache_turnover():
    """A CUDA graph captured from a gemm call keeps the device addresses of the tensor maps and
    scales that call used; more calls than the caches hold, then reuse of the freed memory, must
    not change what the graph computes."""
    import cupy as cp
    import numpy as np
    import fp8lab.gpu.codecs as G
    from fp8lab.gpu import gemm as GM
    rng = np.random.default_rng(3)
    a = G.encode(cp.asarray(rng.standard_normal((256, 512)).astype(np.float32)), "e4m3")
    b = G.encode(cp.asarray(rng.standard_normal((384, 512)).astype(np.float32)), "e4m3")
    kw = dict(scale_a=0.5, scale_b=2.0, out_dtype="bfloat16")
    ref = GM.gemm(a, b, "e4m3", "e4m3", **kw).view(cp.uint16).get()
    out = cp.zeros((256, 384), cp.uint16)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        GM.gemm(a, b, "e4m3", "e4m3", out=out, **kw)   # builds and caches the launch plan
        s.synchronize()
        mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)
        s.begin_capture() if mode is None else s.begin_capture(mode)
        GM.gemm(a, b, "e4m3", "e4m3", out=out, **kw)
        graph = s.end_capture()
        out.fill(0)
        others = [cp.empty((256, 384), cp.uint16) for _ in range(300)]   # new addresses: new plans
        for o in others:
            GM.gemm(a, b, "e4m3", "e4m3", out=o, **kw)
        s.synchronize()
        # the call captured is kept by the plan caches (the raw-argument one finds it first)
        assert len(GM._plans) <= GM._plans.limit and len(GM._gemm_fast) <= GM._gemm_fast.limit
        assert GM._plans.kept() + GM._gemm_fast.kept() >= 1
        del others, o
        junk = [cp.full(1 << 16, 0xFF, cp.uint8) for _ in range(200)]   # reuse the freed memory
        graph.launch(stream=s)
        s.synchronize()
    assert np.array_equal(out.get(), ref)
    del junk


def test_gemm_repeated_calls_follow_every_argument():
    """Calls with ``out`` given replay their plan from the raw arguments (one entry per distinct
    call); each result equals the same product through the full path (``out=None``)."""
    import cupy as cp
    import fp8lab.gpu.gemm as GM
    a = cp.random.randint(0, 0x70, (300, 512), dtype=cp.uint8)   # rows 16-byte aligned: replayable
    b = cp.random.randint(0, 0x70, (264, 512), dtype=cp.uint8)
    sa_dev = cp.full(1, 0.5, cp.float32)
    rows = cp.linspace(0.5, 2.0, 300, dtype=cp.float32)
    cols = cp.linspace(1.0, 3.0, 264, dtype=cp.float32)
    out = cp.empty((300, 264), cp.uint16)
    cases = [dict(scale_a=0.5), dict(scale_a=0.25), dict(scale_a=sa_dev), dict(scale_a=sa_dev, scale_b=4.0),
             dict(scaling="row_col", scale_a=rows, scale_b=cols)]
    for kw in cases:
        n0 = len(GM._gemm_fast.keys())
        for _ in range(3):
            got = GM.gemm(a, b, "e4m3", out_dtype="bfloat16", out=out, **kw)
            assert got is out
            assert bool((out == GM.gemm(a, b, "e4m3", out_dtype="bfloat16", **kw)).all()), kw
        assert len(GM._gemm_fast.keys()) == n0 + 1, kw
    sa_dev[...] = 0.125   # same array, new value: read on the device at each call
    assert bool((GM.gemm(a, b, "e4m3", out_dtype="bfloat16", out=out, scale_a=sa_dev)
                 == GM.gemm(a, b, "e4m3", out_dtype="bfloat16", scale_a=0.125)).all())
    bt = cp.ascontiguousarray(b.T)
    GM.gemm(a, bt, "e4m3", layout="nn", out_dtype="bfloat16", out=out)
    assert bool((out == GM.gemm(a, b, "e4m3", out_dtype="bfloat16")).all())
    with pytest.raises(ValueError, match="inner dimensions"):
        GM.gemm(a, bt, "e4m3", out_dtype="bfloat16", out=out)


def test_plans_do_not_hold_the_callers_arrays():
    """A cached plan must not keep a call's output (or inputs) alive: 40 calls with out=None whose
    results are dropped leave the pool's used memory where it was (give or take the caches'
    workspaces) and reuse one output address, so they share a plan or two."""
    import cupy as cp
    import fp8lab.gpu.gemm as GM
    pool = cp.get_default_memory_pool()
    a = cp.random.randint(0, 0x70, (1024, 512), dtype=cp.uint8)
    b = cp.random.randint(0, 0x70, (1024, 512), dtype=cp.uint8)
    x = cp.random.standard_normal((1024, 512), dtype=cp.float32)
    for call in (lambda: GM.gemm(a, b, "e4m3", out_dtype="bfloat16"),
                 lambda: GM.gemm_fused(x, b, "e4m3", scale_a=0.25, out_dtype="bfloat16", check=False)):
        call()
        cp.cuda.Device().synchronize()
        used, plans = pool.used_bytes(), len(GM._plans)
        for _ in range(40):   # each output 2 MB: held by plans, 80 MB
            call()
        cp.cuda.Device().synchronize()
        assert pool.used_bytes() - used < 8 << 20
        assert len(GM._plans) - plans <= 2


@pytest.mark.parametrize("fp8_width", [192, 256])
def test_wide_tiles_within_bound_and_fp8_bits_unchanged(monkeypatch, fp8_width):
    """The 128 x 192 or 128 x 256 (FP8, two halves) and 128 x 256 (f16) CTA tiles on ragged shapes,
    with TMA-store and direct-store epilogues: every case within the float64 bound, and FP8 outputs
    bit-identical to the 128-wide tiles'."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_gemm
    import fp8lab.gpu.gemm as GM
    monkeypatch.setattr(GM, "WIDE_TILES", "always")
    monkeypatch.setattr(GM, "WIDE_FP8", fp8_width)
    assert gpu_gemm.check(print, shapes=gpu_gemm.WIDE_SHAPES) == 0
    assert gpu_gemm.check_wide(print) == 0

