"""Scaling recipes: construction, text form, geometry, scale rules and delayed scaling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fp8lab
from fp8lab.scaling import KINDS, DelayedScaling, Scaling, compute_scale
from strategies_scaling import FORMATS, MX_FORMATS, NON_MX_FORMATS, recipes


@given(recipes(ndim=3))
def test_text_form_round_trips(sc):
    assert Scaling.parse(str(sc)) == sc


@pytest.mark.parametrize("text,expected", [
    ("tensor", Scaling.per_tensor()),
    ("channel", Scaling.per_channel(-1)),
    ("channel:0", Scaling.per_channel(0)),
    ("block", Scaling.per_block(128)),
    ("block:64", Scaling.per_block(64)),
    ("tile", Scaling.per_tile(128)),
    ("tile:32", Scaling.per_tile(32)),
    ("mx", Scaling.mx(32)),
    ("mx:16", Scaling.mx(16)),
    ("mx_up", Scaling.mx(32, round_up=True)),
    ("block:16,axis=0,pow2,margin=2", Scaling.per_block(16, 0, pow2=True, margin=2)),
])
def test_parse_accepts_documented_forms(text, expected):
    assert Scaling.parse(text) == expected


@pytest.mark.parametrize("text", ["blocks", "block:x", "tile:8,axis=0", "tensor:3", "mx,pow2=1",
                                  "channel:1,axis=0", "block,foo"])
def test_parse_rejects_and_lists_forms(text):
    with pytest.raises(ValueError, match='"tensor", "channel", "channel:AXIS"'):
        Scaling.parse(text)


@pytest.mark.parametrize("make", [lambda: Scaling.per_block(0), lambda: Scaling.per_tile(-3),
                                  lambda: Scaling.mx(0), lambda: Scaling.parse("block:0")])
def test_block_below_one_is_refused(make):
    with pytest.raises(ValueError, match=">= 1"):
        make()


def test_constructor_validation_names_choices():
    with pytest.raises(ValueError, match="known: tensor, channel, tile, block, mx"):
        Scaling("rows")
    with pytest.raises(ValueError, match="pow2 must be True"):
        Scaling("mx", block=32, axis=-1, pow2=False)
    with pytest.raises(ValueError, match="round_up applies to mx"):
        Scaling("block", block=32, axis=-1, round_up=True)
    with pytest.raises(ValueError, match="margin must be >= 0"):
        Scaling.per_tensor(margin=-1)
    with pytest.raises(ValueError, match="block must be an int"):
        Scaling.per_block(12.5)


def test_cost_rank_orders_cheapest_first():
    ranks = [Scaling.per_tensor(), Scaling.per_channel(), Scaling.per_tile(), Scaling.per_block(),
             Scaling.mx()]
    assert [s.cost_rank for s in ranks] == list(range(len(KINDS)))


def test_ragged_geometry():
    shape = (303, 300)
    assert Scaling.per_block(128).scale_shape(shape) == (303, 3)
    assert Scaling.per_tile(128).scale_shape(shape) == (3, 3)
    assert Scaling.per_channel(0).scale_shape(shape) == (1, 300)
    assert Scaling.per_channel().scale_shape(shape) == (303, 1)
    assert Scaling.per_block(100, axis=0).scale_shape(shape) == (4, 300)
    assert Scaling.mx().scale_shape(shape) == (303, 10)
    assert Scaling.per_tensor().scale_shape(shape) == (1, 1)


def test_axis_out_of_range_names_valid_axes():
    with pytest.raises(ValueError, match=r"axis 2 is out of range for a 2-d array; valid: -2..1"):
        Scaling.per_block(32, axis=2).scale_shape((4, 4))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        Scaling.per_tile().scale_shape((10,))


@pytest.mark.parametrize("fmt", NON_MX_FORMATS)
def test_mx_refuses_non_mx_formats(fmt):
    with pytest.raises(ValueError, match="OCP MX element formats"):
        fp8lab.quantize(np.ones(32, np.float32), fmt, scaling="mx")


@pytest.mark.parametrize("fmt", FORMATS)
def test_plain_scale_maps_amax_to_target(fmt):
    fmax = fp8lab.finfo(fmt).scale_target
    amax = np.array([fmax, 1.0, 3.5e-7, 7.25e5, 2.0**-140])
    s = compute_scale(amax, fmt)
    assert np.array_equal(s, np.float32(amax / fmax).clip(2.0**-127))


@pytest.mark.parametrize("fmt", FORMATS)
@given(a=st.floats(2.0**-100, 2.0**100), margin=st.integers(0, 3))
def test_pow2_scale_is_least_power_of_two(fmt, a, margin):
    fmax = fp8lab.finfo(fmt).scale_target
    s = float(compute_scale(a, fmt, Scaling.per_tensor(pow2=True, margin=margin)))
    m, _ = math.frexp(s)
    assert m == 0.5  # a power of two
    k = s / 2.0**margin
    assert a <= fmax * k < 2 * a  # least k with amax <= max * k


@pytest.mark.parametrize("fmt", MX_FORMATS)
@given(a=st.floats(2.0**-100, 2.0**100))
def test_mx_rule(fmt, a):
    f = fp8lab.get_format(fmt)
    emax = math.floor(math.log2(f.finfo.max))
    s = float(compute_scale(a, fmt, "mx"))
    assert s == 2.0 ** (math.frexp(a)[1] - 1 - emax)  # 2^(floor(log2 amax) - emax_elem)
    assert a / s < 2.0 ** (emax + 1)
    up = float(compute_scale(a, fmt, "mx_up"))
    assert a / up <= f.finfo.max < 2 * a / up  # round-up never overflows, and is the least


def test_special_amax_policy():
    assert compute_scale(0.0, "e4m3")[()] == 1.0
    assert compute_scale(np.inf, "e4m3")[()] == 2.0**127
    assert compute_scale(1e-300, "e4m3")[()] == 2.0**-127  # clamped to the E8M0 range
    assert compute_scale(1e300, "e5m2", "tensor,pow2")[()] == 2.0**127
    for bad in (np.nan, -1.0):
        with pytest.raises(ValueError, match="amax must be >= 0 and not NaN"):
            compute_scale(bad, "e4m3")


def test_delayed_history_semantics():
    ds = DelayedScaling(length=3, algo="max")
    assert ds.amax is None and ds.compute_scale("e4m3") is None
    for a in [1.0, 8.0, 2.0]:
        ds.update_amax(a)
    assert ds.history == (1.0, 8.0, 2.0) and ds.amax == 8.0
    ds.update_amax(0.5)  # 1.0 drops out; 8.0 still the max
    assert ds.history == (8.0, 2.0, 0.5) and ds.amax == 8.0
    ds.update_amax(0.25)
    ds.update_amax(0.125)  # 8.0 drops out
    assert ds.amax == 0.5
    recent = DelayedScaling(length=3, algo="most_recent")
    for a in [4.0, 1.0]:
        recent.update_amax(a)
    assert recent.amax == 1.0
    assert recent.compute_scale("e4m3") == np.float32(1.0 / 448)


def test_delayed_margin_pow2_and_special_values():
    ds = DelayedScaling(length=2, margin=1, pow2=True)
    ds.update(np.array([3.0, -5.0, np.nan, np.inf], np.float32))
    assert ds.history == (5.0,) and ds.nonfinite_steps == 1
    assert ds.compute_scale("e4m3") == 2.0 ** -6 * 2  # 5 <= 448 * 2^-6, margin doubles it
    ds.update(np.array([np.nan, np.inf]))
    assert ds.history == (5.0, 0.0)
    ds.update(np.zeros(3))
    assert ds.amax == 0.0 and ds.compute_scale("e4m3") == 1.0
    for bad in (np.nan, np.inf, -1.0):
        with pytest.raises(ValueError, match="finite float >= 0"):
            ds.update_amax(bad)
    with pytest.raises(ValueError, match="known: max, most_recent"):
        DelayedScaling(algo="mean")
    with pytest.raises(ValueError, match="length must be >= 1"):
        DelayedScaling(length=0)


def test_quantize_with_delayed_scaling_uses_the_history():
    x = np.array([1.0, -2.0, 100.0], np.float32)
    ds = DelayedScaling(length=4)
    first = fp8lab.quantize(x, "e4m3", scaling=ds)  # empty history: current amax
    assert first.scales[0] == np.float32(100.0 / 448)
    ds.update_amax(1000.0)
    qt = fp8lab.quantize(x, "e4m3", scaling=ds)
    assert qt.scales[0] == np.float32(1000.0 / 448) and ds.history == (1000.0,)
    assert str(qt.scaling) == "tensor"
    ds.reset()
    ds.update(x * 1000)  # an outlier step: the next step's scale is too large, not overflowing
    small = fp8lab.quantize(x, "e4m3", scaling=ds)
    assert small.scales[0] == np.float32(100000.0 / 448)
