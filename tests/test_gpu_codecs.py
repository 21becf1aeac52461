"""GPU codecs equal the CPU codecs bit for bit (skipped without CuPy and an sm_90 GPU)."""

import numpy as np
import pytest

import fp8lab
import fp8lab.gpu
from fp8lab.formats import ROUNDING_MODES

OK, WHY = fp8lab.gpu.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)
FORMATS = fp8lab.list_formats()


def _sample(n=1 << 20, seed=0):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x[: n // 2] = (rng.standard_normal(n // 2) * np.exp2(rng.integers(-25, 18, n // 2))).astype(np.float32)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]
    return x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ROUNDING_MODES)
@pytest.mark.parametrize("sat", [False, True])
def test_encode_matches_cpu(fmt, mode, sat):
    import cupy as cp
    seed = 1234 if mode == "stochastic" else None
    x = _sample()[: 303 * 300].reshape(303, 300)  # ragged: not a multiple of the vector width
    for arr in (x, x.astype(np.float64), x.astype(np.float16)):
        want = fp8lab.encode(arr, fmt, rounding=mode, saturate=sat, seed=seed)
        got = fp8lab.encode(cp.asarray(arr), fmt, rounding=mode, saturate=sat, seed=seed)
        assert isinstance(got, cp.ndarray) and got.shape == arr.shape
        np.testing.assert_array_equal(got.get(), want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_all_float16_and_bfloat16(fmt):
    import cupy as cp
    import ml_dtypes
    u = np.arange(1 << 16, dtype=np.uint16)
    for mode in ROUNDING_MODES:
        seed = 7 if mode == "stochastic" else None
        want = fp8lab.encode(u.view(np.float16), fmt, rounding=mode, seed=seed)
        np.testing.assert_array_equal(fp8lab.gpu.encode(cp.asarray(u).view(cp.float16), fmt, rounding=mode,
                                                        seed=seed).get(), want)
        want = fp8lab.encode(u.view(ml_dtypes.bfloat16), fmt, rounding=mode, seed=seed)
        np.testing.assert_array_equal(fp8lab.gpu.encode(cp.asarray(u), fmt, rounding=mode, seed=seed,
                                                        bfloat16=True).get(), want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_decode_all_codes(fmt, dtype):
    import cupy as cp
    codes = np.arange(256, dtype=np.uint8)
    want = fp8lab.decode(codes, fmt, dtype=dtype)
    got = fp8lab.decode(cp.asarray(codes), fmt, dtype=dtype).get()
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


def test_unaligned_view_and_paths():
    import cupy as cp
    x = _sample(1 << 16)
    d = cp.asarray(x)[3:]  # not 16-byte aligned: the scalar path
    want = fp8lab.encode(x[3:], "hif8")
    for path in ("bits", "lut"):
        np.testing.assert_array_equal(fp8lab.gpu.encode(d, "hif8", path=path).get(), want)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_all_float32_inputs(fmt):
    from fp8lab.gpu.check import check_float32_all
    for mode in ROUNDING_MODES[:3]:
        for sat in (False, True):
            r = check_float32_all(fmt, mode, sat)
            assert all(v[0] == 0 for v in r.values()), r
