"""Hypothesis strategies for fp8lab's codec tests (tested themselves in test_strategies.py).

Every strategy takes a Format and draws float64 values that are exact float32 values too, so
the same draw can be fed to the float32, float64 and reference paths.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

import fp8lab

FORMATS = fp8lab.list_formats()


def grid(fmt) -> list[Fraction]:
    """0, the positive finite values, and the overflow value (the rounding grid)."""
    f = fp8lab.get_format(fmt)
    return [Fraction(0), *f.positive_values, f.overflow_value]


def _signed(draw, v: float) -> float:
    return -v if draw(st.booleans()) else v


def codes() -> st.SearchStrategy[int]:
    return st.integers(0, 255)


@st.composite
def representable(draw, fmt) -> float:
    """A finite value of the format (either sign)."""
    return _signed(draw, float(draw(st.sampled_from(grid(fmt)[:-1]))))


@st.composite
def ties(draw, fmt) -> float:
    """An exact midpoint between two neighbours of the rounding grid (0 and overflow included)."""
    g = grid(fmt)
    i = draw(st.integers(0, len(g) - 2))
    return _signed(draw, float((g[i] + g[i + 1]) / 2))


@st.composite
def near_ties(draw, fmt) -> float:
    """One float32 ulp below or above an exact tie."""
    t = np.float32(abs(draw(ties(fmt))))
    direction = np.float32(np.inf) if draw(st.booleans()) else np.float32(0)
    return _signed(draw, float(np.nextafter(t, direction)))


@st.composite
def overflow_region(draw, fmt) -> float:
    """Magnitudes from max to 4x the overflow value, and infinity."""
    f = fp8lab.get_format(fmt)
    lo, hi = float(f.max_value), 4 * float(f.overflow_value)
    v = draw(st.one_of(st.floats(lo, hi, width=32), st.just(float("inf")),
                       st.just(float(np.float32(f.overflow_value)))))
    return _signed(draw, v)


@st.composite
def subnormals(draw, fmt) -> float:
    """Magnitudes below the smallest normal value, down to far below the smallest value."""
    fi = fp8lab.finfo(fmt)
    v = draw(st.floats(0, fi.smallest_normal, width=32, exclude_max=True)
             | st.floats(0, fi.smallest_subnormal * 2, width=32))
    return _signed(draw, v)


@st.composite
def in_range(draw, fmt) -> float:
    """Any finite float32 whose magnitude is below the overflow value."""
    f = fp8lab.get_format(fmt)
    return _signed(draw, draw(st.floats(0, float(f.overflow_value), width=32, exclude_max=True)))


def inputs(fmt) -> st.SearchStrategy[float]:
    """A mixture of all the above plus arbitrary float32 values (NaN and Inf included)."""
    return st.one_of(representable(fmt), ties(fmt), near_ties(fmt), overflow_region(fmt),
                     subnormals(fmt), in_range(fmt), st.floats(width=32))
