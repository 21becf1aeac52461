"""The strategies draw what their names promise."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

import fp8lab
from strategies import (FORMATS, grid, near_ties, overflow_region, representable, subnormals,
                        ties, in_range)


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_representable_is_a_value(fmt, data):
    v = data.draw(representable(fmt))
    assert Fraction(abs(v)) in set(grid(fmt)[:-1])


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_ties_are_midpoints(fmt, data):
    v = Fraction(abs(data.draw(ties(fmt))))
    g = grid(fmt)
    i = max(k for k in range(len(g)) if g[k] < v)
    assert g[i] < v < g[i + 1] and v - g[i] == g[i + 1] - v
    assert float(np.float32(v)) == float(v)  # exact in float32


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_near_ties_are_one_ulp_from_a_tie(fmt, data):
    v = np.float32(abs(data.draw(near_ties(fmt))))
    g = grid(fmt)
    mids = {(g[i] + g[i + 1]) / 2 for i in range(len(g) - 1)}
    below, above = np.nextafter(v, np.float32(0)), np.nextafter(v, np.float32(np.inf))
    assert Fraction(float(v)) not in mids
    assert Fraction(float(below)) in mids or Fraction(float(above)) in mids


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_overflow_region(fmt, data):
    v = abs(data.draw(overflow_region(fmt)))
    assert v >= fp8lab.finfo(fmt).max


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_subnormals_and_range(fmt, data):
    assert abs(data.draw(subnormals(fmt))) < fp8lab.finfo(fmt).smallest_normal
    assert abs(data.draw(in_range(fmt))) < float(fp8lab.get_format(fmt).overflow_value)
