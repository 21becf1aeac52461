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
