"""Error metrics: each definition on hand-built cases, special values, ulp bounds, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8lab
from fp8lab import quantize
from fp8lab.metrics import ErrorMetrics, error_metrics, ulp_distance
from strategies_scaling import FORMATS, recipes, shapes, tensors


def test_definitions_on_a_hand_built_case():
    x = np.array([[1.0, -2.0, 4.0], [0.5, 0.0, 8.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    y = x.copy()
    y[0, 0] = 1.25  # e = 0.25, rel 0.25
    y[1, 2] = 7.0   # e = -1, rel 0.125
    y[3, 1] = 0.0   # e = -2, rel 1, an underflow
    m = error_metrics(x, y)
    sig, noise = float(np.sum(x * x)), 0.25**2 + 1 + 4
    assert m.n == 12 and m.nan_count == 0 and m.inf_count == 0
    assert m.sqnr_db == pytest.approx(10 * math.log10(sig / noise))
    assert m.rel_error == pytest.approx(math.sqrt(noise / sig))
    assert m.cosine == pytest.approx(float(np.sum(x * y)) / math.sqrt(sig * float(np.sum(y * y))))
    assert m.max_abs_error == 2.0 and m.max_rel_error == 1.0
    rows = [0.25 / math.sqrt(21), 1 / math.sqrt(64.25), 0.0, 2 / math.sqrt(12)]
    assert m.row_p50_error == pytest.approx(np.percentile(rows, 50))
    assert m.row_p90_error == pytest.approx(np.percentile(rows, 90))
    assert m.p99_row_error == pytest.approx(np.percentile(rows, 99)) == m.row_p99_error
    assert m.underflow_frac == 1 / 12 and m.overflow_frac == 0.0
    assert m.ulp_max is None and m.saturated_frac is None  # no format given
    assert set(m.to_dict()) == {f.name for f in __import__("dataclasses").fields(ErrorMetrics)}


def test_nan_inf_in_reference_are_counted_and_excluded():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 2.0], np.float32)
    m = error_metrics(x, quantize(x, "e4m3", scaling="tensor,pow2"))
    assert (m.n, m.nan_count, m.inf_count) == (2, 1, 2)
    assert m.sqnr_db == math.inf and m.rel_error == 0.0 and m.cosine == 1.0
    assert m.overflow_frac == 0.0


def test_overflow_saturation_and_underflow():
    x = np.array([1.0, 500.0, 460.0, 1e-4, -1e-3, 0.0], np.float32)
    raw = error_metrics(x, quantize(x, "e4m3", scales=[1.0]))
    assert raw.overflow_frac == 1 / 6  # 500 -> NaN (E4M3 has no Inf); 460 rounds to 448
    assert raw.sqnr_db == -math.inf and raw.max_abs_error == math.inf and raw.ulp_max == math.inf
    sat = error_metrics(x, quantize(x, "e4m3", scales=[1.0], saturate=True))
    assert sat.overflow_frac == 0.0 and sat.saturated_frac == 1 / 6
    assert sat.underflow_frac == 1 / 6  # 1e-4 flushed to zero; 1e-3 rounds to 2^-9 (nonzero)
    assert error_metrics(x, x, fmt="e5m2").saturated_frac == 0.0


def test_zero_reference_and_empty():
    z = np.zeros((3, 4))
    m = error_metrics(z, z, fmt="e4m3")
    assert m.sqnr_db == math.inf and m.rel_error == 0.0 and m.cosine == 1.0 and m.ulp_max == 0.0
    off = error_metrics(z, np.full((3, 4), 0.5))
    assert off.sqnr_db == -math.inf and off.rel_error == math.inf and off.cosine == 0.0
    assert off.row_p50_error == math.inf
    e = error_metrics(np.zeros((0, 3)), np.zeros((0, 3)))
    assert e.n == 0 and e.max_abs_error == 0.0


@settings(max_examples=40)
@given(data=st.data(), fmt=st.sampled_from(FORMATS), shape=shapes(1, 2),
       rounding=st.sampled_from(["nearest_even", "nearest_away", "toward_zero"]))
def test_ulp_distance_matches_the_rounding_mode(data, fmt, shape, rounding):
    sc = data.draw(recipes(len(shape), fmt))
    if sc.kind == "mx":
        sc = fp8lab.Scaling.mx(sc.block, round_up=True, axis=sc.axis)
    x = data.draw(tensors(shape))
    m = error_metrics(x, quantize(x, fmt, scaling=sc, rounding=rounding))
    assert m.overflow_frac == 0.0
    if rounding == "toward_zero":
        assert m.ulp_max < 1.0
    else:
        assert m.ulp_max <= 0.5


@pytest.mark.parametrize("fmt", FORMATS)
def test_ulp_distance_counts_grid_steps(fmt):
    f = fp8lab.get_format(fmt)
    vals = np.array([float(v) for v in f.positive_values])
    # between neighbours v0 < v1: moving from v0 to v1 is exactly one ulp of v0's binade
    d = ulp_distance(vals[:-1], vals[1:], fmt)
    same_binade = np.floor(np.log2(vals[:-1])) == np.floor(np.log2(vals[1:]))
    assert np.all(d[same_binade] == 1.0)


def test_bad_input():
    with pytest.raises(ValueError, match=r"reference has shape \(3,\) but the approximation has shape \(4,\)"):
        error_metrics(np.ones(3), np.ones(4))
    qt = quantize(np.ones(3), "e4m3")
    with pytest.raises(ValueError, match="fmt='e5m2' but the QTensor is 'e4m3'"):
        error_metrics(np.ones(3), qt, fmt="e5m2")


def test_chunked_accumulation_equals_one_pass(monkeypatch):
    """error_metrics streams over chunks of rows; the chunk size must not change the result
    beyond summation order (1e-12 relative), including NaN/Inf inputs and every recipe."""
    import math
    import fp8lab.metrics as M
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((37, 5, 29)) * np.exp(rng.uniform(-6, 6, (37, 5, 29)))).astype(np.float32)
    x[3, 1, 4], x[20, 0, 0], x[36, 4, 28] = np.nan, np.inf, -np.inf
    for sc in ("tensor", "channel", "block:8", "tile:4"):
        qt = fp8lab.quantize(x, "e4m3", scaling=sc)
        whole = M.error_metrics(x, qt).to_dict()
        monkeypatch.setattr(M, "CHUNK_ELEMENTS", 100)
        parts = M.error_metrics(x, qt).to_dict()
        monkeypatch.undo()
        for k, v in whole.items():
            w = parts[k]
            if isinstance(v, float) and math.isnan(v):
                assert math.isnan(w), k
            else:
                assert w == pytest.approx(v, rel=1e-12, abs=0), (sc, k)


def test_zero_dimensional_input():
    m = error_metrics(np.float32(3.1), fp8lab.quantize(np.float32(3.1), "e4m3"))
    assert m.n == 1 and m.rel_error < 2.0**-4 and m.p99_row_error == m.rel_error


def test_peak_memory_is_a_constant_beyond_the_inputs():
    import tracemalloc
    x = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)  # 16 MiB
    qt = fp8lab.quantize(x, "e4m3", scaling="block")
    error_metrics(x, qt)  # warm-up (compilation)
    tracemalloc.start()
    error_metrics(x, qt)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1.5 * x.nbytes, peak  # about 6 MiB of per-chunk temporaries; was ~34x x.nbytes
