"""gemm_fused (quantize-on-load and fused epilogue) on the GPU (skipped without a GPU)."""

import sys
from pathlib import Path

import numpy as np
import pytest

import fp8lab.gpu

OK, WHY = fp8lab.gpu.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_conversion_matches_cpu_quantize():
    import gpu_fused
    assert gpu_fused.check_convert(print, n_random=1 << 16) == 0


def test_fused_kernel_equals_its_composition():
    import gpu_fused
    # (300, 512, 520): 5 K-tiles, ragged M and K
    assert gpu_fused.check_gemm(print, shapes=((129, 257, 130), (1, 1, 1), (200, 136, 72), (300, 512, 520))) == 0


def test_fused_kernel_calls_in_a_row():
    import gpu_fused
    # 9 tile rows, several conversion units each: counters claimed, counted and reset per call
    assert gpu_fused.check_repeat(print, shapes=((1100, 384, 700),)) == 0


def test_converted_once_codes_of_every_16_bit_input():
    import gpu_fused
    # a power of two, two reciprocal-path scales (mid-range, near its lower end), a division-path one
    assert gpu_fused.check_codes(print, scales=(32.0, 448.0 / 3.0, 2.0 ** -59 * 1.7, 3.0e30)) == 0


def test_fused_rejects_bad_input():
    import cupy as cp
    from fp8lab.gpu.gemm import gemm_fused
    x = cp.ones((4, 32), cp.float32)
    w = cp.zeros((8, 32), cp.uint8)
    with pytest.raises(ValueError, match="e4m3 / e5m2"):
        gemm_fused(x, w, "hif8")
    with pytest.raises(TypeError, match="bfloat16=True"):
        gemm_fused(x, w, "e4m3", bfloat16=True)
    with pytest.raises(TypeError, match="a must be"):
        gemm_fused(x.astype(cp.float64), w, "e4m3")
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm_fused(x, w[:, :16], "e4m3")
    with pytest.raises(ValueError, match="out_scale"):
        gemm_fused(x, w, "e4m3", out_dtype="e4m3")
    with pytest.raises(ValueError, match="8-bit outputs"):
        gemm_fused(x, w, "e4m3", out_scale=1.0)
    with pytest.raises(ValueError, match="unknown out_dtype"):
        gemm_fused(x, w, "e4m3", out_dtype="int8")
    with pytest.raises(TypeError, match="bias"):
        gemm_fused(x, w, "e4m3", bias=cp.zeros(7, cp.float32))
    for bad in (0.0, -2.0, float("nan")):
        with pytest.raises(ValueError, match="finite"):
            gemm_fused(x, w, "e4m3", scale_a=bad)
    with pytest.raises(ValueError, match="finite and > 0"):
        gemm_fused(x, w, "e4m3", scale_a=cp.zeros(1, cp.float32))
    with pytest.raises(TypeError, match="amax_out"):
        gemm_fused(x, w, "e4m3", amax_out=cp.zeros(2, cp.float32))
    with pytest.raises(ValueError, match="amax_a"):
        gemm_fused(w[:4], w, "e4m3", amax_a=cp.zeros(1, cp.float32))
    with pytest.raises(ValueError, match="saturate"):
        gemm_fused(x, w, "e4m3", saturate="yes")


def test_fused_small_example_by_hand():
    # 2 x 2 with K = 1: C = relu(q(A) * sa * decode(B) * sb + bias), A's codes at sa = 0.5
    import cupy as cp
    import fp8lab
    from fp8lab.gpu.gemm import gemm_fused
    a = cp.asarray(np.float32([[1.0], [-3.0]]))
    b = cp.asarray(fp8lab.encode(np.float32([[2.0], [0.5]]), "e4m3"))
    bias = cp.asarray(np.float32([1.0, 10.0]))
    amax_out = cp.zeros(1, cp.float32)
    c = gemm_fused(a, b, "e4m3", scale_a=0.5, bias=bias, relu=True, out_dtype="float32", amax_out=amax_out)
    # row 0: 1 * 2 + 1 = 3, 1 * 0.5 + 10 = 10.5; row 1: -6 + 1 -> 0, -1.5 + 10 = 8.5
    assert c.get().tolist() == [[3.0, 10.5], [0.0, 8.5]]
    assert float(amax_out.get()[0]) == 10.5


def test_fused_repeated_calls_follow_every_argument():
    """Repeats take the raw-argument fast path (one entry per distinct call); a changed scale,
    flag or device-scale value still gives the composed route's result, bit for bit, and bad
    input after a cached call is still rejected."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    import fp8lab.gpu.gemm as GM
    rng = np.random.default_rng(3)
    x = cp.asarray((rng.standard_normal((130, 96)) * 4).astype(np.float32))
    w = G.encode(cp.asarray(rng.standard_normal((40, 96)).astype(np.float32)), "e4m3", saturate=True)
    dev_scale = cp.full(1, np.float32(0.03), cp.float32)

    def both(**kw):
        fused = GM.gemm_fused(x, w, "e4m3", out_dtype="float32", check=False, **kw)
        composed = GM.gemm_fused(x, w, "e4m3", out_dtype="float32", kernel="composed", **kw)
        assert bool((fused.view(cp.uint32) == composed.view(cp.uint32)).all()), kw
        return fused

    first = both(scale_a=0.5)
    out = cp.empty((130, 40), cp.float32)
    n0 = len(GM._fused_fast.keys())
    for _ in range(3):   # one entry for the three calls: the later two found it
        r = GM.gemm_fused(x, w, "e4m3", scale_a=0.5, out_dtype="float32", out=out, check=False)
        assert r is out and bool((out == first).all())
    assert len(GM._fused_fast.keys()) == n0 + 1
    both(scale_a=0.25)
    both(scale_a=0.25, relu=True)
    both(scale_a=0.25, bias=cp.asarray(rng.standard_normal(40).astype(np.float32)))
    both(scale_a=dev_scale)
    dev_scale[...] = 0.07   # same array, new value: read on the device at each call
    both(scale_a=dev_scale)
    both(scale_a=dev_scale, scale_b=2.0)
    with pytest.raises(ValueError, match="saturate"):
        GM.gemm_fused(x, w, "e4m3", scale_a=0.5, out_dtype="float32", saturate="yes", check=False)
    with pytest.raises(ValueError, match="finite and > 0"):
        GM.gemm_fused(x, w, "e4m3", scale_a=cp.zeros(1, cp.float32), out_dtype="float32")


def test_fused_imported_input_read_in_place():
    """An A imported through DLPack (whose memory may report another size) is read in place when
    its rows end on 16-byte boundaries (no copy per call); with a ragged K it may be copied rather
    than over-read. Both give the composed route's result."""
    import cupy as cp
    import fp8lab.gpu.codecs as G
    import fp8lab.gpu.gemm as GM
    rng = np.random.default_rng(4)
    for K in (96, 130):
        x = cp.asarray(rng.standard_normal((70, K)).astype(np.float32))
        xi = cp.from_dlpack(x)
        if K == 96:
            assert GM._k_major(xi, 4, cp, "qa", whole_rows=True) is xi
        w = G.encode(cp.asarray(rng.standard_normal((24, K)).astype(np.float32)), "e4m3", saturate=True)
        fused = GM.gemm_fused(xi, w, "e4m3", scale_a=0.125, out_dtype="float32", kernel="fused")
        composed = GM.gemm_fused(x, w, "e4m3", scale_a=0.125, out_dtype="float32", kernel="composed")
        assert bool((fused.view(cp.uint32) == composed.view(cp.uint32)).all())
