"""Stochastic rounding: reproducible, independent of threads and chunking, unbiased."""

import numba
import numpy as np
import pytest

import fp8lab
from fp8lab import _kernels as K
from fp8lab.codecs import _encoder_params, _seed_key
from fp8lab.reference import encode_value, random_bits

FORMATS = fp8lab.list_formats()


def test_random_bits_generator_matches_numba():
    key = _seed_key(12345)
    for i in (0, 1, 2, 1000, 2**40 + 7):
        assert K.random_bits(key, i) == random_bits(12345, i)


@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference_elementwise(fmt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(3000) * np.exp2(rng.integers(-26, 18, 3000))).astype(np.float32)
    got = fp8lab.encode(x, fmt, rounding="stochastic", seed=99)
    for i in range(0, 3000, 7):
        assert got[i] == encode_value(float(x[i]), fmt, "stochastic", False, random_bits(99, i)), i


def test_same_for_any_thread_count_and_layout():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 700)).astype(np.float32)  # above the parallel threshold
    a = fp8lab.encode(x, "e4m3", rounding="stochastic", seed=5)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        b = fp8lab.encode(x, "e4m3", rounding="stochastic", seed=5)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(a, b)
    # serial kernel on the same bits (the small-array path) agrees element for element
    out = np.empty(x.size, np.uint8)
    K.encode_bits_serial(x.reshape(-1).view(np.uint32), out, np.int64(32), np.int64(24), np.int64(127),
                         np.int64(3), False, *_encoder_params(fp8lab.get_format("e4m3")),
                         _seed_key(5), np.int64(0))
    np.testing.assert_array_equal(a.reshape(-1), out)
    # element i depends on its C-order index, whatever the memory layout
    f = np.asfortranarray(x)
    np.testing.assert_array_equal(fp8lab.encode(f, "e4m3", rounding="stochastic", seed=5), a)
    # float16 input gives the float32 result of the same values
    h = x.astype(np.float16)
    np.testing.assert_array_equal(fp8lab.encode(h, "hif8", rounding="stochastic", seed=5),
                                  fp8lab.encode(h.astype(np.float32), "hif8", rounding="stochastic", seed=5))
    assert not np.array_equal(a, fp8lab.encode(x, "e4m3", rounding="stochastic", seed=6))


@pytest.mark.parametrize("fmt", FORMATS)
def test_unbiased(fmt):
    """E[decode(encode_sr(x))] = x. With 2^20 draws the mean's standard error is at most
    gap / 2^11 (gap = distance between the two neighbours of x), so the bound gap / 200 is over
    9 standard errors wide, yet a rounding biased by 1% of the gap would exceed it."""
    f = fp8lab.get_format(fmt)
    grid = np.array([0.0] + [float(v) for v in f.positive_values])
    n = 1 << 20
    for x in (1.3, -0.7183, 0.75 * f.finfo.smallest_subnormal, 0.49 * f.finfo.max, 1 / 3):
        i = np.searchsorted(grid, abs(x)) - 1
        gap = grid[i + 1] - grid[i]
        assert grid[i] < abs(x) < grid[i + 1]
        mean = fp8lab.decode(fp8lab.encode(np.full(n, x), fmt, rounding="stochastic", seed=2024),
                             fmt, dtype=np.float64).mean()
        assert abs(mean - x) < gap / 200, (x, mean, gap)
