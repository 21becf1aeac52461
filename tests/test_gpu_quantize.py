"""GPU quantize against the CPU quantize, bit for bit (skipped without a GPU)."""

import sys
from pathlib import Path

import pytest

import fp8lab.gpu

OK, WHY = fp8lab.gpu.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)


def test_quantize_bit_identical_to_cpu():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_quantize
    assert gpu_quantize.check(print, shapes=((303, 300), (7, 3, 200), (1, 1))) == 0


def test_cast_transpose_bit_identical_to_cpu():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_quantize
    assert gpu_quantize.check_cast_transpose(print, shapes=((1, 1), (130, 67), (64, 128))) == 0


def test_cast_transpose_rejects_bad_input():
    import cupy as cp
    import numpy as np
    from fp8lab.gpu.quantize import cast_transpose
    x = cp.ones((4, 8), cp.float32)
    with pytest.raises(TypeError, match="2-D float32 or float16"):
        cast_transpose(cp.ones((2, 4, 8), cp.float32), "e4m3", 1.0)
    with pytest.raises(TypeError, match="2-D float32 or float16"):
        cast_transpose(x.astype(cp.float64), "e4m3", 1.0)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            cast_transpose(x, "e4m3", bad)
    with pytest.raises(ValueError, match="finite and > 0"):
        cast_transpose(x, "e4m3", cp.zeros(1, cp.float32))
    with pytest.raises(TypeError, match="one element"):
        cast_transpose(x, "e4m3", cp.ones(2, cp.float32))
    with pytest.raises(TypeError, match="amax"):
        cast_transpose(x, "e4m3", 1.0, amax=cp.zeros(1, cp.float64))
    with pytest.raises(ValueError, match="stochastic"):
        cast_transpose(x, "e4m3", 1.0, rounding="stochastic")
    with pytest.raises(ValueError):
        cast_transpose(x, "e9m9", 1.0)
    empty = cast_transpose(cp.ones((0, 8), cp.float32), "e4m3", 1.0)
    assert empty.q.codes.shape == (0, 8) and empty.t.shape == (8, 0)
    assert float(empty.amax.get()[0]) == 0.0
    import fp8lab
    one = fp8lab.encode(np.ones((8, 4), np.float32), "e4m3")
    assert np.array_equal(cast_transpose(x, "e4m3", 1.0).t.get(), one)


def test_scales_from_amax_matches_compute_scale():
    import cupy as cp
    import numpy as np
    from fp8lab.gpu.quantize import scales_from_amax
    from fp8lab.scaling import compute_scale
    amax = np.array([0.0, 1e-30, 0.3, 1.0, 448.0, 3.0e5, 1e38, np.inf], np.float64)
    for fmt in ("e4m3", "e5m2", "hif8"):
        for rec in ("tensor", "tensor,pow2", "tensor,margin=1"):
            got = scales_from_amax(cp.asarray(amax.astype(np.float32)), fmt, rec).get()
            ref = compute_scale(amax.astype(np.float32).astype(np.float64), fmt, rec)
            assert got.dtype == np.float32
            assert np.array_equal(got.view(np.uint32), np.asarray(ref, np.float32).view(np.uint32)), (fmt, rec)
