"""quantize / QTensor: the definition, error bounds, ragged blocks, special values, files, views."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8lab
from fp8lab import QTensor, Scaling, quantize
from fp8lab.reference import encode_value
from fp8lab.scaling import compute_scale
from strategies_scaling import FORMATS, MX_FORMATS, recipes, shapes, tensors

ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero"]


def expanded(qt: QTensor) -> np.ndarray:
    """Each element's scale, built independently of QTensor.expanded_scales (index arithmetic)."""
    bs = qt.scaling.block_shape(qt.shape)
    idx = np.meshgrid(*[np.arange(d) // b for d, b in zip(qt.shape, bs)], indexing="ij")
    return qt.scales[tuple(idx)].astype(np.float64)


def half_step(fmt, v: np.ndarray) -> np.ndarray:
    """Half the distance between the two format values around each |v| (in range)."""
    grid = np.array([0.0] + [float(p) for p in fp8lab.get_format(fmt).positive_values])
    i = np.clip(np.searchsorted(grid, v, side="right"), 1, len(grid) - 1)
    return (grid[i] - grid[i - 1]) / 2


@settings(max_examples=60)
@given(data=st.data(), fmt=st.sampled_from(FORMATS), shape=shapes(1, 3))
def test_codes_follow_the_definition(data, fmt, shape):
    """codes == encode(x / s) with a float64 quotient, for every recipe and rounding mode."""
    sc = data.draw(recipes(len(shape), fmt))
    x = data.draw(tensors(shape))
    rounding = data.draw(st.sampled_from(ROUNDINGS))
    qt = quantize(x, fmt, scaling=sc, rounding=rounding)
    s = expanded(qt)
    sat = sc.kind == "mx" and not sc.round_up
    assert np.array_equal(qt.codes, fp8lab.encode(x.astype(np.float64) / s, fmt, rounding=rounding,
                                                  saturate=sat))
    assert qt.scales.shape == sc.scale_shape(shape) and qt.shape == shape
    assert np.all(qt.scales > 0) and np.all(np.isfinite(qt.scales))
    if sc.pow2:
        assert np.all(np.frexp(qt.scales)[0] == 0.5)


@settings(max_examples=60)
@given(data=st.data(), fmt=st.sampled_from(FORMATS), shape=shapes(1, 2))
def test_dequantize_within_half_ulp(data, fmt, shape):
    """|dequantize(quantize(x)) - x| <= s * half the format's local spacing, element-wise."""
    sc = data.draw(recipes(len(shape), fmt))
    if sc.kind == "mx" and not sc.round_up:
        sc = Scaling.mx(sc.block, round_up=True, axis=sc.axis, margin=sc.margin)  # no clamping
    x = data.draw(tensors(shape))
    qt = quantize(x, fmt, scaling=sc, rounding="nearest_even")
    s = expanded(qt)
    v = np.abs(x.astype(np.float64)) / s
    # amax maps to the scale target (max; 15 for HiF8) up to the float32 rounding of the scale
    assert v.max() <= fp8lab.finfo(fmt).scale_target * (1 + 2.0**-23)
    err = np.abs(qt.dequantize(np.float64) - x)
    assert np.all(err <= s * half_step(fmt, v))


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_quotient_is_correctly_rounded(fmt):
    """For float32 x and s, encode(fl64(x / s)) equals rounding the exact rational x / s."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(400) * np.exp2(rng.integers(-12, 12, 400))).astype(np.float32)
    s = np.float32(rng.uniform(0.001, 0.01, 400))
    for rounding in ROUNDINGS:
        qt = quantize(x, fmt, scaling="block:1", rounding=rounding, scales=s)
        want = [encode_value(Fraction(float(a)) / Fraction(float(b)), fmt, rounding)
                for a, b in zip(x, s)]
        assert qt.codes.tolist() == want


def _float32_sweep() -> np.ndarray:
    """Every float32 high half (sign, exponent, 7 mantissa bits) with five low halves."""
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0xFFFF], np.uint32)
    return (hi[:, None] | lows[None, :]).reshape(-1).view(np.float32)


# Scales on both sides of the float32 path's 2^-60 limit, non-powers of two, and scales with
# which finite inputs overflow float32 (x / s >= 2^128) or underflow it.
SWEEP_SCALES = [1.0, 3.0, 0.7, 448 / 1.7, 2.0**-60, 1.5 * 2.0**-60, 2.0**-61 * 1.9, 2.0**-127,
                2.0**100 * 1.3, 2.0**127]


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_path_on_every_high_half(fmt):
    """Float32 input, deterministic modes: codes == encode(fl64(x / s)) on a dense sweep."""
    x = _float32_sweep()
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet
        x64 = x.astype(np.float64)
    for s in SWEEP_SCALES:
        s32 = np.float32(s)
        for rounding in ROUNDINGS:
            for sat in (False, True):
                qt = quantize(x, fmt, scaling="tensor", scales=np.array([s32]), rounding=rounding,
                              saturate=sat)
                want = fp8lab.encode(x64 / np.float64(s32), fmt, rounding=rounding, saturate=sat)
                assert np.array_equal(qt.codes, want), (s, rounding, sat)


def test_float32_and_float64_paths_in_one_row():
    """Blocks of one row alternate between the float32 path and the float64 one (tiny scale)."""
    x = _float32_sweep()[: 1 << 18]
    scales = np.where(np.arange(x.size // 64) % 2 == 0, 0.37, 2.0**-70).astype(np.float32)
    qt = quantize(x, "e4m3", scaling="block:64", scales=scales)
    s = np.repeat(scales, 64).astype(np.float64)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(qt.codes, fp8lab.encode(x.astype(np.float64) / s, "e4m3"))


@pytest.mark.parametrize("sc", ["block:128", "tile:128", "channel:0", "channel", "block:100,axis=0",
                                "tile:7", "mx:32"])
def test_ragged_block_boundaries(sc):
    """Every block's scale is the rule applied to exactly that block's elements."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((303, 300)) * np.exp2(rng.integers(-8, 8, (303, 300)))).astype(np.float32)
    qt = quantize(x, "e4m3", scaling=sc)
    bs = qt.scaling.block_shape(x.shape)
    for idx in np.ndindex(*qt.scales.shape):
        block = x[tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, bs))]
        assert qt.scales[idx] == compute_scale(np.abs(block).max(), "e4m3", qt.scaling)[()]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("sc", ["tensor", "block:32", "tile:16", "channel:0"])
def test_large_inputs_take_the_parallel_paths(fmt, sc):
    if sc.startswith("mx") and fmt not in MX_FORMATS:
        return
    rng = np.random.default_rng(11)
    x = rng.standard_normal((517, 301)) * np.exp2(rng.integers(-6, 6, (517, 301)))
    for arr in (x.astype(np.float32), x):  # float32 and float64 kernels
        qt = quantize(arr, fmt, scaling=sc)
        s = expanded(qt)
        assert np.array_equal(qt.codes, fp8lab.encode(arr.astype(np.float64) / s, fmt))
        qs = quantize(arr, fmt, scaling=sc, rounding="stochastic", seed=5)
        assert np.array_equal(qs.codes, fp8lab.encode(arr.astype(np.float64) / s, fmt,
                                                      rounding="stochastic", seed=5))


@pytest.mark.parametrize("fmt", FORMATS)
def test_all_zero_and_all_max(fmt):
    f = fp8lab.get_format(fmt)
    z = quantize(np.zeros((5, 130), np.float32), fmt, scaling="block")
    assert np.all(z.scales == 1.0) and np.all(z.codes == f.zero_codes[0])
    assert np.array_equal(z.dequantize(), np.zeros((5, 130), np.float32))
    for sc in ("tensor", "block", "tile:4", "channel:0"):
        big = np.full((5, 130), 3.0e4, np.float32)
        big[1] *= -1
        qt = quantize(big, fmt, scaling=sc)
        # every element at +-(the scale target): max, or 15 for HiF8
        target = f.code_of[f.finfo.scale_target]
        assert set(np.unique(qt.codes & 0x7F)) == {target}
        np.testing.assert_allclose(qt.dequantize(np.float64), big, rtol=2.0**-23)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_and_inf_policy(fmt):
    f = fp8lab.get_format(fmt)
    x = np.array([[1.0, np.nan, -np.inf, 4.0], [np.nan, np.nan, np.inf, np.nan]], np.float32)
    qt = quantize(x, fmt, scaling="channel")
    assert qt.scales[0, 0] == np.float32(4.0 / f.finfo.scale_target)  # finite elements only
    assert qt.scales[1, 0] == 1.0  # no finite element
    deq = qt.dequantize()
    assert np.isnan(deq[0, 1]) and np.isnan(deq[1, 0])
    assert np.array_equal(qt.codes, fp8lab.encode(x.astype(np.float64) / expanded(qt), fmt))
    sat = quantize(x, fmt, scaling="channel", saturate=True)
    assert sat.dequantize()[0, 2] == -np.float32(f.finfo.max) * sat.scales[0, 0]


def test_mx_clamps_by_default():
    x = np.array([[1.0] * 31 + [1.99]], np.float32)  # amax/X = 2^8 * 1.99 > 448
    qt = quantize(x, "e4m3", scaling="mx")
    assert qt.dequantize()[0, -1] == 448 * qt.scales[0, 0]
    raw = quantize(x, "e4m3", scaling="mx", saturate=False)
    assert np.isnan(raw.dequantize()[0, -1])


def test_scalars_and_empty_arrays():
    q = quantize(3.0, "e4m3", scaling="tensor,pow2")
    assert q.shape == () and q.scales.shape == () and q.dequantize(np.float64) == 3.0
    with pytest.raises(ValueError, match="at least 1 dimension"):
        quantize(3.0, "e4m3", scaling="block")
    e = quantize(np.zeros((0, 5), np.float32), "e4m3", scaling="block")
    assert e.scales.shape == (0, 1) and e.dequantize().shape == (0, 5)
    assert quantize(np.ones((2, 0)), "e4m3").scales.tolist() == [[1.0]]


def test_any_memory_layout_and_dtype():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    ref = quantize(x, "e5m2", scaling="block:16")
    for view in (np.asfortranarray(x), x.T.copy().T, x[::1, :]):
        assert np.array_equal(quantize(view, "e5m2", scaling="block:16").codes, ref.codes)
    import ml_dtypes

    h = x.astype(np.float16)
    qh = quantize(h, "e5m2", scaling="block:16")
    assert qh.dtype == np.float16
    assert np.array_equal(qh.codes, quantize(h.astype(np.float32), "e5m2", scaling="block:16").codes)
    b = x.astype(ml_dtypes.bfloat16)
    assert quantize(b, "e4m3").dtype.name == "bfloat16"


def test_dequantize_dtypes_round_once():
    """dequantize(dtype) is the exact product rounded once to nearest-even in dtype."""
    import ml_dtypes

    rng = np.random.default_rng(4)
    x = (rng.standard_normal(300) * 100).astype(np.float32)
    s = np.float32(1.0009765625 + 2.0**-20)
    qt = quantize(x, "e4m3", scales=[s])
    exact = [Fraction(float(v)) * Fraction(float(s))
             for v in fp8lab.decode(qt.codes, "e4m3", dtype="float64")]
    assert qt.dequantize(np.float64).tolist() == [float(e) for e in exact]
    for dt, ut in ((np.float16, np.uint16), (ml_dtypes.bfloat16, np.uint16), (np.float32, np.uint32)):
        got = qt.dequantize(dt)
        assert got.dtype == dt
        for g, e in zip(got.reshape(-1, 1), exact):
            bits = g.view(ut)
            d = abs(Fraction(float(g[0])) - e)
            for nb in ((bits + 1).view(dt), (bits - 1).view(dt)):
                if np.isfinite(float(nb[0])):
                    dn = abs(Fraction(float(nb[0])) - e)
                    assert d < dn or (d == dn and int(bits[0]) % 2 == 0)


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((33, 70)).astype(np.float32)
    for fmt, sc in (("e4m3", "tile:16,pow2"), ("hif8", "block:32,axis=0,margin=1"), ("e5m2", "mx_up:8")):
        qt = quantize(x, fmt, scaling=sc)
        path = tmp_path / f"{fmt}.npz"
        qt.save(path)
        back = QTensor.load(path)
        assert back.format is qt.format and back.scaling == qt.scaling and back.dtype == qt.dtype
        assert np.array_equal(back.codes, qt.codes) and np.array_equal(back.scales, qt.scales)
        with np.load(path, allow_pickle=False) as z:
            assert str(z["scaling"]) == str(qt.scaling)
    np.savez(tmp_path / "bad.npz", codes=qt.codes)
    with pytest.raises(ValueError, match="not a QTensor file"):
        QTensor.load(tmp_path / "bad.npz")


def test_ml_dtypes_view_shares_memory():
    import ml_dtypes

    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    for fmt, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
        qt = quantize(x, fmt, scaling="channel")
        v = qt.as_ml_dtypes()
        assert v.dtype == dt and np.shares_memory(v, qt.codes)
        assert np.array_equal(v.astype(np.float32) * qt.expanded_scales(), qt.dequantize())
    with pytest.raises(ValueError, match="no ml_dtypes equivalent"):
        quantize(x, "hif8").as_ml_dtypes()


def test_bad_scales_and_shapes_name_what_was_expected():
    codes = np.zeros((4, 10), np.uint8)
    with pytest.raises(ValueError, match=r"expected shape \(4, 3\)"):
        QTensor(codes, np.ones((4, 2), np.float32), "e4m3", "block:4")
    for bad in (0.0, -1.0, np.nan, np.inf):
        s = np.ones((4, 3), np.float32)
        s[1, 2] = bad
        with pytest.raises(ValueError, match="finite and > 0"):
            QTensor(codes, s, "e4m3", "block:4")
        with pytest.raises(ValueError, match="finite and > 0"):
            quantize(np.ones((4, 10)), "e4m3", scaling="block:4", scales=s)
    with pytest.raises(ValueError, match="uint8"):
        QTensor(codes.astype(np.int16), np.ones((4, 3), np.float32), "e4m3", "block:4")
    with pytest.raises(ValueError, match="exactly representable in float32"):
        QTensor(codes, np.full((4, 3), 0.1), "e4m3", "block:4")
    with pytest.raises(ValueError, match="OCP MX element formats"):
        QTensor(codes, np.ones((4, 1), np.float32), "hif8", "mx")
    with pytest.raises(ValueError, match="out of range"):
        quantize(np.ones((4, 10)), "e4m3", scaling=Scaling.per_channel(3))
    with pytest.raises(ValueError, match="saturate must be a bool"):
        quantize(np.ones(3), "e4m3", saturate="yes")


def test_qtensor_is_frozen_and_read_only():
    qt = quantize(np.ones((2, 2), np.float32), "e4m3")
    with pytest.raises(Exception):
        qt.codes = np.zeros((2, 2), np.uint8)
    with pytest.raises(ValueError):
        qt.codes[0, 0] = 1
    assert qt.nbytes == 4 + 4 and "e4m3" in repr(qt)
