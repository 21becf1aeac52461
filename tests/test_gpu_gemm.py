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


def test_gemm_mma_fallback_still_correct():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_gemm
    assert gpu_gemm.check(print, shapes=((129, 257, 130),), kernel="mma") == 0


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
