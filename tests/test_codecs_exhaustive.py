"""Exhaustive checks over every float16 and every bfloat16 input (2^16 each)."""

import numpy as np
import pytest

import fp8lab
from fp8lab.reference import encode_array_vectorized

ml_dtypes = pytest.importorskip("ml_dtypes")

FORMATS = fp8lab.list_formats()
MODES = ["nearest_even", "nearest_away", "toward_zero"]
ALL16 = {
    "float16": np.arange(1 << 16, dtype=np.uint16).view(np.float16),
    "bfloat16": np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16),
}
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
      "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("kind", list(ALL16))
def test_all_16bit_inputs_against_reference(fmt, mode, saturate, kind):
    x = ALL16[kind]
    want = encode_array_vectorized(x, fmt, mode, saturate)
    np.testing.assert_array_equal(fp8lab.encode(x, fmt, rounding=mode, saturate=saturate), want)
    # the same values through the float32 and float64 paths
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(fp8lab.encode(x32, fmt, rounding=mode, saturate=saturate), want)
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet NaNs: same code
        x64 = x32.astype(np.float64)
    np.testing.assert_array_equal(fp8lab.encode(x64, fmt, rounding=mode, saturate=saturate), want)


@pytest.mark.parametrize("fmt", list(ML))
@pytest.mark.parametrize("kind", list(ALL16))
def test_all_16bit_inputs_against_ml_dtypes(fmt, kind):
    x = ALL16[kind].astype(np.float32)
    got = fp8lab.encode(x, fmt)
    want = x.astype(ML[fmt]).view(np.uint8)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    f = fp8lab.get_format(fmt)
    assert set(got[nan].tolist()) <= set(f.nan_codes)


@pytest.mark.parametrize("fmt", list(ML))
def test_decode_against_ml_dtypes(fmt):
    codes = np.arange(256, dtype=np.uint8)
    got = fp8lab.decode(codes, fmt, dtype=np.float32)
    want = codes.view(ML[fmt]).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_table_path_on_every_high_half(fmt):
    """The float32 lookup path depends on (hi16, lo16 != 0): check every hi16 with several lo16
    against the generic encoder (the float64 path) and the reference."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    for lo in (0, 1, 0x7FFF, 0x8000, 0xFFFF):
        x = (hi | np.uint32(lo)).view(np.float32)
        for mode in MODES:
            for sat in (False, True):
                got = fp8lab.encode(x, fmt, rounding=mode, saturate=sat)
                with np.errstate(invalid="ignore"):
                    x64 = x.astype(np.float64)
                generic = fp8lab.encode(x64, fmt, rounding=mode, saturate=sat)
                np.testing.assert_array_equal(got, generic, err_msg=f"lo={lo:#x} {mode} {sat}")
                np.testing.assert_array_equal(got, encode_array_vectorized(x, fmt, mode, sat))
