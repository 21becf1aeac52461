"""Format declarations, derived facts, decode of all 256 codes, registry."""

import math
from fractions import Fraction

import numpy as np
import pytest

import fp8lab
from fp8lab.formats import data_dir, get_format, _build
from fp8lab.reference import decode_code

FORMATS = fp8lab.list_formats()
DTYPES = ["float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_all_codes(fmt, dtype):
    """All 256 codes decode to the reference value: bits of the value, NaN by class, sign of 0."""
    f = get_format(fmt)
    out = fp8lab.decode(np.arange(256, dtype=np.uint8), fmt, dtype=dtype)
    assert out.dtype.name == dtype
    for c in range(256):
        v, got = decode_code(c, fmt), float(out[c])
        if f.classes[c] == "nan":
            assert math.isnan(got), (c, got)
        else:
            assert got == float(v), (c, got, v)
            assert math.copysign(1, got) == math.copysign(1, float(v)), c


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode_roundtrip_every_code(fmt):
    f = get_format(fmt)
    codes = np.array([c for c in range(256) if f.classes[c] != "nan"], np.uint8)
    for dtype in DTYPES:
        x = fp8lab.decode(codes, fmt, dtype=dtype)
        for mode in ("nearest_even", "nearest_away", "toward_zero"):
            for sat in (False, True):
                got = fp8lab.encode(x, fmt, rounding=mode, saturate=sat)
                if sat and f.inf_codes:  # +-Inf saturates to +-max
                    want = np.where(np.isin(codes, f.inf_codes), f.max_code | (codes & 0x80), codes)
                else:
                    want = codes
                np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {mode} {sat}")
        got = fp8lab.encode(x, fmt, rounding="stochastic", seed=3)
        np.testing.assert_array_equal(got, codes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_committed_table_matches_declaration(fmt):
    assert (data_dir("formats") / f"{fmt}.csv").read_text() == get_format(fmt).table_csv()


def test_finfo_derived_values():
    # independent facts from the OCP spec, the FNUZ proposal and the HiF8 paper
    want = {
        "e4m3": (448, 2**-6, 2**-9, 2**-3, 253, (0x7F, 0xFF), ()),
        "e5m2": (57344, 2**-14, 2**-16, 2**-2, 247, (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF), (0x7C, 0xFC)),
        "e4m3fnuz": (240, 2**-7, 2**-10, 2**-3, 255, (0x80,), ()),
        "e5m2fnuz": (57344, 2**-15, 2**-17, 2**-2, 255, (0x80,), ()),
        "hif8": (32768, 2**-15, 2**-22, 2**-3, 253, (0x80,), (0x6F, 0xEF)),
    }
    assert sorted(want) == FORMATS
    for name, (mx, mn, sub, eps, nfin, nans, infs) in want.items():
        fi = fp8lab.finfo(name)
        assert (fi.max, fi.smallest_normal, fi.smallest_subnormal, fi.eps) == (mx, mn, sub, eps), name
        assert (fi.n_finite, fi.nan_codes, fi.inf_codes) == (nfin, nans, infs), name
    # the top of the full-precision range: max, except HiF8 whose 3-bit region ends at 15
    assert {n: fp8lab.finfo(n).scale_target for n in want} == {
        "e4m3": 448, "e5m2": 57344, "e4m3fnuz": 240, "e5m2fnuz": 57344, "hif8": 15}


def test_lookup_by_alias_and_errors():
    assert get_format("E4M3").name == "e4m3"
    assert get_format("float8_e4m3fn").name == "e4m3"
    assert get_format("HiFloat8").name == "hif8"
    f = get_format("e5m2")
    assert get_format(f) is f
    with pytest.raises(ValueError, match=r"unknown format 'float8_e4m3'; known: e4m3, e4m3fnuz"):
        get_format("float8_e4m3")  # another format in ml_dtypes: never an alias
    with pytest.raises(TypeError, match="format must be a name"):
        get_format(3)


def test_pickles_as_a_registry_reference():
    import pickle
    assert pickle.loads(pickle.dumps(get_format("hif8"))) is get_format("hif8")


def test_bad_declarations_are_refused():
    base = dict(name="x", kind="binary", exponent_bits=4, mantissa_bits=3, bias=7, specials="fn",
                nan_encode=[0x7F, 0xFF], default_rounding="nearest_even")
    assert _build(base).finfo.max == 448
    with pytest.raises(ValueError, match="must be 8"):
        _build({**base, "mantissa_bits": 4})
    with pytest.raises(ValueError, match="specials must be"):
        _build({**base, "specials": "odd"})
    with pytest.raises(ValueError, match="nan_encode"):
        _build({**base, "nan_encode": [0x7E, 0xFF]})
    with pytest.raises(ValueError, match="default_rounding"):
        _build({**base, "default_rounding": "up"})
    with pytest.raises(ValueError, match="unknown kind"):
        _build({**base, "kind": "posit"})


def test_values_exact_in_all_decode_types():
    for name in FORMATS:
        for dt in DTYPES:
            t = get_format(name).decode_table(dt)
            assert not t.flags.writeable


def test_data_dir_inside_installed_package_or_checkout():
    d = data_dir("formats")
    assert (d / "e4m3.toml").is_file()
    assert d.name in ("_formats", "formats")
    with pytest.raises(ValueError, match="unknown data folder"):
        data_dir("nope")


def test_hif8_tapered_structure():
    """Mantissa width per binade follows the dot table: 3 bits for |E| <= 3, 2 for 4..7, 1 for 8..15."""
    f = get_format("hif8")
    b = f.binades
    width = dict(zip(range(b.e_low, b.e_max + 1), b.mbits.tolist()))
    for e in range(-15, 16):
        want = 3 if abs(e) <= 3 else 2 if abs(e) <= 7 else 1
        assert width[e] == want, e
    for e in range(-22, -15):
        assert width[e] == 0  # denormal extension: one value per binade
    assert Fraction(f.overflow_value) == Fraction(3, 2) * 2**15
