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
    assert gpu_gemm.check(print, shapes=((303, 300, 1000), (129, 257, 130), (1, 1, 1))) == 0


def test_gemm_errors_name_what_works():
    import cupy as cp
    from fp8lab.gpu.gemm import gemm
    a = cp.zeros((4, 8), cp.uint8)
    with pytest.raises(ValueError, match="known: tensor, row_col, block"):
        gemm(a, a, "e4m3", scaling="rows")
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm(a, cp.zeros((4, 9), cp.uint8), "e4m3")
