"""Bad input gives clear errors; odd but valid input works."""

import numpy as np
import pytest

import fp8lab


@pytest.mark.parametrize("x", [np.arange(4), np.array([1, 2], np.uint8), np.array([1 + 2j]),
                               np.array(["a"]), np.array([1.0], object), np.array([True]),
                               3, True, "1.0", [1, 2]])
def test_non_float_input_is_a_type_error(x):
    with pytest.raises(TypeError, match="accepted: float64, float32, float16 or bfloat16|convert it"):
        fp8lab.encode(x, "e4m3")


def test_longdouble_is_refused_not_rounded_silently():
    if np.dtype(np.longdouble).itemsize == 8:
        pytest.skip("longdouble is float64 on this platform")
    with pytest.raises(TypeError, match="convert it to float64 explicitly"):
        fp8lab.encode(np.ones(2, np.longdouble), "e4m3")


def test_unknown_format_and_mode():
    with pytest.raises(ValueError, match="unknown format 'e4m3x'; known: e4m3"):
        fp8lab.encode([1.0], "e4m3x")
    with pytest.raises(ValueError, match="unknown rounding mode 'up'; known: nearest_even, "
                                         "nearest_away, toward_zero, stochastic"):
        fp8lab.encode([1.0], "e4m3", rounding="up")


def test_seed_rules():
    with pytest.raises(ValueError, match="needs seed="):
        fp8lab.encode([1.0], "e4m3", rounding="stochastic")
    with pytest.raises(ValueError, match="only used by rounding='stochastic'"):
        fp8lab.encode([1.0], "e4m3", seed=3)
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError, match="seed must be an int"):
            fp8lab.encode([1.0], "e4m3", rounding="stochastic", seed=bad)
    assert fp8lab.encode([1.0], "e4m3", rounding="stochastic", seed=2**64 - 1)[0] == 0x38


def test_saturate_must_be_bool():
    with pytest.raises(TypeError, match="saturate must be a bool"):
        fp8lab.encode([1.0], "e4m3", saturate="yes")


def test_decode_bad_codes_and_dtype():
    with pytest.raises(ValueError, match="0..255"):
        fp8lab.decode([256], "e4m3")
    with pytest.raises(ValueError, match="0..255"):
        fp8lab.decode(np.array([-1]), "e4m3")
    with pytest.raises(TypeError, match="codes must be uint8"):
        fp8lab.decode(np.array([1.0]), "e4m3")
    with pytest.raises(TypeError, match="accepted: float16, bfloat16, float32, float64"):
        fp8lab.decode([1], "e4m3", dtype=np.int32)
    assert fp8lab.decode([0x38], "e4m3", dtype="float64").tolist() == [1.0]


@pytest.mark.parametrize("fmt", fp8lab.list_formats())
def test_empty_scalars_and_layouts(fmt):
    for dt in (np.float16, np.float32, np.float64):
        e = fp8lab.encode(np.empty((0, 3), dt), fmt)
        assert e.shape == (0, 3) and e.dtype == np.uint8
    assert fp8lab.decode(np.empty(0, np.uint8), fmt).shape == (0,)
    assert fp8lab.encode(np.float32(1.0), fmt).shape == ()
    assert fp8lab.encode(1.0, fmt).shape == ()
    x = np.random.default_rng(0).standard_normal((40, 30))
    want = fp8lab.encode(x, fmt)
    np.testing.assert_array_equal(fp8lab.encode(np.asfortranarray(x), fmt), want)
    np.testing.assert_array_equal(fp8lab.encode(x[:, ::2], fmt), want[:, ::2])
    np.testing.assert_array_equal(fp8lab.encode(x.T, fmt), want.T)
    np.testing.assert_array_equal(fp8lab.encode(x.astype(">f8"), fmt), want)  # big-endian input
    c = fp8lab.encode(x, fmt)
    np.testing.assert_array_equal(fp8lab.decode(c[:, ::3], fmt), fp8lab.decode(c, fmt)[:, ::3])


def test_bfloat16_input_and_output():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.0, -3.5, 1e-3], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(fp8lab.encode(x, "hif8"), fp8lab.encode(x.astype(np.float32), "hif8"))
    y = fp8lab.decode(fp8lab.encode(x, "e4m3"), "e4m3", dtype=ml_dtypes.bfloat16)
    assert y.dtype == ml_dtypes.bfloat16
    assert fp8lab.decode([0x38], "e4m3", dtype="bfloat16").dtype == ml_dtypes.bfloat16
