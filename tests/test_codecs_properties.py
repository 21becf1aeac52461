"""Hypothesis properties of the codecs against the definition."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

import fp8lab
from fp8lab.reference import encode_value, encode_array_vectorized
from strategies import FORMATS, grid, inputs, in_range, overflow_region, ties

MODES = ["nearest_even", "nearest_away", "toward_zero"]


def enc(x, fmt, **kw):
    return int(fp8lab.encode(np.array([x], np.float32), fmt, **kw)[0])


def dec(c, fmt):
    return float(fp8lab.decode(np.array([c], np.uint8), fmt, dtype=np.float64)[0])


def magnitude(c, fmt) -> Fraction:
    """|value| of a code on the rounding grid; Inf/NaN (from overflow) -> the overflow value."""
    f = fp8lab.get_format(fmt)
    return f.overflow_value if f.classes[c] in ("inf", "nan") else Fraction(abs(dec(c, fmt)))


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_numba_equals_reference(fmt, data):
    x = data.draw(inputs(fmt))
    mode = data.draw(st.sampled_from(MODES))
    sat = data.draw(st.booleans())
    want = encode_value(float(np.float32(x)), fmt, mode, sat)
    assert enc(x, fmt, rounding=mode, saturate=sat) == want
    assert int(encode_array_vectorized(np.array([x], np.float32), fmt, mode, sat)[0]) == want
    assert int(fp8lab.encode(np.array([x], np.float64), fmt, rounding=mode, saturate=sat)[0]) == want


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_result_is_nearest_under_tie_rule(fmt, data):
    x = data.draw(in_range(fmt) | ties(fmt))
    a = Fraction(abs(x))
    g = grid(fmt)
    for mode in ("nearest_even", "nearest_away"):
        r = magnitude(enc(x, fmt, rounding=mode), fmt)
        best = min(abs(v - a) for v in g)
        assert abs(r - a) == best
        if sum(1 for v in g if abs(v - a) == best) == 2:  # an exact tie
            lo, hi = sorted(v for v in g if abs(v - a) == best)
            if mode == "nearest_away":
                assert r == hi
            else:
                assert (r / (hi - lo)).numerator % 2 == 0 and (r / (hi - lo)).denominator == 1


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_toward_zero_never_grows(fmt, data):
    x = data.draw(in_range(fmt))
    r = dec(enc(x, fmt, rounding="toward_zero"), fmt)
    assert abs(r) <= abs(x)
    assert all(not (abs(r) < float(v) <= abs(x)) for v in grid(fmt)[:-1])


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_monotonic(fmt, data):
    x, y = sorted([data.draw(in_range(fmt)), data.draw(in_range(fmt))])
    def signed(v):
        c = enc(v, fmt, rounding=mode)
        return -magnitude(c, fmt) if np.signbit(v) else magnitude(c, fmt)
    for mode in MODES:
        assert signed(x) <= signed(y)


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_sign_symmetric(fmt, data):
    x = abs(data.draw(inputs(fmt)))
    f = fp8lab.get_format(fmt)
    for mode in MODES:
        for sat in (False, True):
            p, n = enc(x, fmt, rounding=mode, saturate=sat), enc(-x, fmt, rounding=mode, saturate=sat)
            if math.isnan(x) or f.classes[p] == "nan":  # NaN input, or overflow to NaN
                assert p in f.nan_codes and n in f.nan_codes
            elif f.classes[p] == "zero" and not f.has_negative_zero:
                assert n == p  # no -0: negatives that round to zero give +0
            else:
                assert n == p ^ 0x80


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_overflow_policy(fmt, data):
    x = data.draw(overflow_region(fmt))
    f = fp8lab.get_format(fmt)
    sign = 0x80 if x < 0 else 0
    assert enc(x, fmt, saturate=True) in (f.max_code | sign, *[c for c in range(256)
                                          if f.classes[c] != "nan" and abs(dec(c, fmt)) <= f.finfo.max])
    if abs(x) >= float(f.overflow_value):
        assert enc(x, fmt, saturate=True) == f.max_code | sign
        want = f.inf_codes[1 if sign else 0] if f.inf_codes else f.nan_encode[1 if sign else 0]
        assert enc(x, fmt) == want
        if math.isfinite(x):
            assert enc(x, fmt, rounding="toward_zero") == f.max_code | sign


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_to_nan_code_in_every_mode(fmt):
    f = fp8lab.get_format(fmt)
    x = np.array([np.nan, -np.nan, np.float32(np.nan) * 0], np.float32)
    for mode in MODES:
        for sat in (False, True):
            got = fp8lab.encode(x, fmt, rounding=mode, saturate=sat)
            assert got[0] == f.nan_encode[0] and got[1] == f.nan_encode[1]
    assert fp8lab.encode(x, fmt, rounding="stochastic", seed=1)[0] == f.nan_encode[0]
