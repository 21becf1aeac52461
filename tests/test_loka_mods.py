"""LoKA statistics and mods."""

import math

import numpy as np
import pytest

from fp8lab.formats import finfo
from fp8lab.loka import Candidate, OperandStats, Site
from fp8lab.loka.emulate import apply_follow, fake_quant
from fp8lab.loka.mods import DelayedScaling, gate, pow2_scale, recenter_for_layernorm, row_scale_is_free


class FakeCupy:
    """Stands in for a CuPy array: only ``.get()`` (device -> host)."""

    def __init__(self, a):
        self._a = a

    def get(self):
        return self._a


def test_streaming_moments_and_amax_without_forgetting():
    rng = np.random.default_rng(0)
    st = OperandStats(("tensor",), forget=1.0, history=3)
    xs = [rng.standard_normal((16, 8)) * s + s for s in (1.0, 2.0, 0.5, 3.0)]
    for x in xs:
        st.update(FakeCupy(x))
    allx = np.concatenate(xs)
    assert math.isclose(st.mean, allx.mean(), rel_tol=1e-12)
    assert math.isclose(st.var, allx.var(), rel_tol=1e-12)
    assert list(st.amax_history) == [float(np.abs(x).max()) for x in xs[1:]]
    assert np.array_equal(st.row_amax, np.abs(xs[-1]).max(axis=1))
    assert np.array_equal(st.col_amax, np.abs(xs[-1]).max(axis=0))
    edges, counts = st.log2_histogram("tensor")
    assert counts.sum() == allx.size  # every nonzero element lands in a bin (no sampling here)


def test_histogram_position_and_flush_fraction():
    x = np.array([[1.0, 2.0 ** -3, 2.0 ** -20, 0.0]])
    st = OperandStats(("tensor",))
    st.update(x)
    edges, counts = st.log2_histogram("tensor")
    hit = edges[counts > 0]
    assert np.allclose(hit, [-20, -3, 0])           # log2|x| - floor(log2 amax), zeros skipped
    from fp8lab.loka.noise import operand_noise
    rho, over, flush = operand_noise(st.hist_count["tensor"], st.hist_energy["tensor"],
                                     Candidate("e4m3", "e4m3"), "e4m3")
    assert over == 0 and math.isclose(flush, 1 / 3)   # 2^-20 * 448 is below half the subnormal


def test_nan_counted():
    st = OperandStats(("tensor",))
    st.update(np.array([[1.0, np.nan], [np.inf, 2.0]]))
    assert (st.nan_count, st.inf_count, st.amax) == (1, 1, 2.0)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "hif8"])
def test_pow2_scales_never_overflow_and_rescale_exactly(fmt):
    amax = np.array([0.3, 1.0, 5e3, 1e-6])
    s = pow2_scale(amax, fmt)
    assert np.all(np.log2(s) == np.round(np.log2(s)))
    t = finfo(fmt).scale_target
    assert np.all(amax / s <= t) and np.all(amax / s > t / 2)
    x = np.random.default_rng(1).standard_normal((4, 64))
    q = fake_quant(x, fmt, "channel", pow2=True)
    # a power-of-two scale moves only the exponent: quantizing 2^j x gives 2^j Q(x)
    assert np.array_equal(fake_quant(x * 2.0 ** 7, fmt, "channel", pow2=True), q * 2.0 ** 7)


def test_delayed_scaling_history_and_margin():
    d = DelayedScaling("e4m3", history=2, margin=1.5)
    for a in (1.0, 4.0, 2.0):
        d.update(a)
    assert d.amax() == 1.5 * 4.0
    d.update(1.0)
    assert d.amax() == 1.5 * 2.0          # 4.0 has left the 2-step history
    d.update(float("nan"))                # a NaN step does not poison the history
    assert d.amax() == 1.5 * 2.0


def test_recenter_exact_in_float64_with_bias():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((32, 48))
    w = rng.standard_normal((40, 48)) + 3.0
    bias = rng.standard_normal(40) + 1.0
    w2, b2 = recenter_for_layernorm(w, bias)
    y1 = apply_follow(a @ w.T + bias, "layernorm")
    y2 = apply_follow(a @ w2.T + b2, "layernorm")
    assert np.max(np.abs(y1 - y2)) < 1e-11
    assert np.allclose(w2.mean(axis=0), 0, atol=1e-14)


def test_row_scale_dropped_before_norms_only():
    rng = np.random.default_rng(5)
    c = rng.standard_normal((8, 16))
    alpha = rng.uniform(0.1, 10, (8, 1))
    for follow in ("layernorm", "rmsnorm", "none", "relu"):
        same = np.allclose(apply_follow(c * alpha, follow), apply_follow(c, follow), rtol=1e-12)
        assert same == row_scale_is_free(follow)


def test_precision_gating():
    assert gate(Site("x", 4096, 1024, 1024, position="first")).startswith("first layer")
    assert gate(Site("x", 4096, 1, 1024, position="logit")).startswith("logit layer")
    assert gate(Site("x", 32, 32, 32)).startswith("tiny GEMM")
    assert "dimension below" in gate(Site("x", 8192, 8, 1024))
    assert gate(Site("x", 4096, 1024, 1024)) is None


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "hif8"])
def test_emulated_recipes_match_fp8lab_quantize(fmt):
    """LoKA measures with its own recipes; they are fp8lab's: power-of-two recipes agree bit for
    bit, amax/fmax recipes differ only by fp8lab's float32 scale (same codes: a different code
    would differ by at least 2^-4 relative, not 2^-22)."""
    import fp8lab
    from fp8lab.scaling import Scaling

    x = np.random.default_rng(0).standard_normal((300, 300)) * 3  # awkward, non-multiple shape
    recipes = [("tensor", "tensor"), ("channel", "channel"), ("block:128", "block:128"),
               ("tile:128", "tile:128")] + ([("mx", "mx")] if fmt != "hif8" else [])
    for g, spec in recipes:
        for pow2 in ((True,) if g == "mx" else (False, True)):
            ref = fp8lab.quantize(x, fmt, scaling=Scaling.parse(
                spec + (",pow2" if pow2 and g != "mx" else ""))).dequantize()
            got = fake_quant(x, fmt, g, pow2=pow2)
            ref = np.asarray(ref, np.float64)
            if pow2:
                assert np.array_equal(got, ref), (g, pow2)
            else:
                assert np.array_equal(got == 0, ref == 0), g
                nz = got != 0
                assert np.max(np.abs(got - ref)[nz] / np.abs(got[nz])) < 2.0 ** -22, g
