"""Emulated scaled GEMM against rational-arithmetic models, bounds, layouts and bad input."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8lab
from fp8lab import quantize
from fp8lab.gemm import error_bound, gemm, reference_gemm
from strategies_scaling import FORMATS, MX_FORMATS

FMT_PAIRS = [(a, b) for a in FORMATS for b in FORMATS]
RECIPES_2D = ["tensor", "channel", "block:4", "tile:4", "block:3", "mx:8", "tensor,pow2", "channel:0"]


def _recipe(data, fmt):
    options = [r for r in RECIPES_2D if not r.startswith("mx") or fmt in MX_FORMATS]
    return data.draw(st.sampled_from(options))


def _operands(data, shape_a, shape_b):
    fa, fb = data.draw(st.sampled_from(FMT_PAIRS))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape_a) * np.exp2(rng.integers(-10, 10, shape_a))
    y = rng.standard_normal(shape_b) * np.exp2(rng.integers(-10, 10, shape_b))
    a = quantize(x, fa, scaling=_recipe(data, fa))
    b = quantize(y, fb, scaling=_recipe(data, fb))
    return x, y, a, b


def exact_products(a, b):
    """Exact C = A_q @ B_q.T as Fractions (A_q, B_q: dequantized, exact in float64)."""
    A, B = a.dequantize(np.float64), b.dequantize(np.float64)
    return [[sum((Fraction(float(A[m, k])) * Fraction(float(B[n, k])) for k in range(A.shape[1])),
                 Fraction(0)) for n in range(B.shape[0])] for m in range(A.shape[0])]


def round_to(fr: Fraction, dt) -> float:
    """Fraction rounded to nearest-even in dt (float64, float32, float16, bfloat16)."""
    import ml_dtypes

    fi = ml_dtypes.finfo(dt)
    top = np.array(fi.max, dt).reshape(1)
    below = (top.view(np.uint16 if top.itemsize == 2 else np.uint32 if top.itemsize == 4
                      else np.uint64) - 1).view(dt)
    limit = Fraction(float(top[0])) + (Fraction(float(top[0])) - Fraction(float(below[0]))) / 2
    if abs(fr) >= limit:  # nearest-even overflows to infinity
        return math.copysign(math.inf, fr)
    with np.errstate(over="ignore"):
        x = np.array(float(fr), np.float64).astype(dt)  # within one unit of the answer
    bits = x.reshape(1).view(np.uint16 if x.dtype.itemsize == 2 else
                             (np.uint32 if x.dtype.itemsize == 4 else np.uint64))
    cands = [x.reshape(1), (bits + bits.dtype.type(1)).view(x.dtype),
             (bits - bits.dtype.type(1)).view(x.dtype)]
    best = None
    for c in cands:
        v = float(c[0])
        if not math.isfinite(v):
            continue
        key = (abs(Fraction(v) - fr), int(c.view(bits.dtype)[0]) % 2)
        if best is None or key < best[0]:
            best = (key, v)
    return best[1]


@settings(max_examples=40)
@given(data=st.data(), m=st.integers(1, 4), n=st.integers(1, 4), k=st.integers(1, 40))
def test_exact_equals_rational_reference(data, m, n, k):
    _, _, a, b = _operands(data, (m, k), (n, k))
    ex = exact_products(a, b)
    import ml_dtypes

    for dt in (np.float64, np.float32, np.float16, ml_dtypes.bfloat16):
        got = gemm(a, b, accumulate="exact", out_dtype=dt)
        assert got.dtype == dt
        want = [[round_to(v, dt) for v in row] for row in ex]
        assert got.astype(np.float64).tolist() == want


def _segments(a, b, K, promote):
    bka = a.scaling.block_shape(a.shape)[1]
    bkb = b.scaling.block_shape(b.shape)[1]
    cuts = {0, K}
    for step in (bka, bkb, promote):
        if step:
            cuts.update(range(0, K, step))
    return sorted(cuts)


def _round_sig(v: Fraction, p: int, nearest: bool) -> Fraction:
    if v == 0:
        return v
    e = math.floor(math.log2(abs(v)))
    while Fraction(2) ** e > abs(v):
        e -= 1
    while Fraction(2) ** (e + 1) <= abs(v):
        e += 1
    unit = Fraction(2) ** (e - p + 1)
    q = v / unit
    r = round(q) if nearest else math.trunc(q)
    return r * unit


def fp32_model(a, b, promote=None, amb=None, nearest=False):
    """docs/gemm.md's "fp32" model, written with numpy float32 scalars and Fractions."""
    A = fp8lab.decode(a.codes, a.format, dtype="float64")
    B = fp8lab.decode(b.codes, b.format, dtype="float64")
    SA, SB = a.expanded_scales(), b.expanded_scales()
    M, K = A.shape
    N = B.shape[0]
    seg = _segments(a, b, K, promote)
    out = np.zeros((M, N), np.float32)
    for m in range(M):
        for n in range(N):
            main = np.float32(0)
            for k0, k1 in zip(seg, seg[1:]):
                acc = np.float32(0) if amb is None else Fraction(0)
                for k in range(k0, k1):
                    p = np.float32(A[m, k] * B[n, k])
                    if amb is None:
                        acc = np.float32(acc + p)
                    else:
                        acc = _round_sig(acc + Fraction(float(p)), amb + 1, nearest)
                sc = np.float32(float(SA[m, k0]) * float(SB[n, k0]))
                exact = Fraction(float(acc)) * Fraction(float(sc)) + Fraction(float(main))
                main = np.float32(round_to(exact, np.float32))
            out[m, n] = main
    return out


@settings(max_examples=30)
@given(data=st.data(), m=st.integers(1, 3), n=st.integers(1, 3), k=st.integers(1, 40),
       promote=st.sampled_from([None, 1, 5, 16]), amb=st.sampled_from([None, 3, 13]),
       nearest=st.booleans())
def test_fp32_equals_its_documented_model(data, m, n, k, promote, amb, nearest):
    _, _, a, b = _operands(data, (m, k), (n, k))
    got = gemm(a, b, accumulate="fp32", promote_interval=promote, accumulator_mantissa_bits=amb,
               accumulator_rounding="nearest_even" if nearest else "toward_zero")
    want = fp32_model(a, b, promote, amb, nearest)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("m,n,k,recipe_a,recipe_b", [
    (13, 37, 300, "block:128", "tile:128"),   # 3 row tiles, 3 column tiles, 3 segments
    (50, 17, 130, "channel", "tensor"),       # crosses a work item (48 rows)
    (7, 16, 129, "tensor", "block:64"),
])
def test_fp32_tiles_equal_the_model(m, n, k, recipe_a, recipe_b):
    """Shapes that end inside the kernel's register tiles and work items, every output checked."""
    rng = np.random.default_rng(m * 1000 + n)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-6, 6, (m, k)))
    y = rng.standard_normal((n, k)) * np.exp2(rng.integers(-6, 6, (n, k)))
    a = quantize(x, "e4m3", scaling=recipe_a)
    b = quantize(y, "e5m2", scaling=recipe_b)
    got = gemm(a, b, accumulate="fp32")
    want = fp32_model(a, b)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("hif8", "hif8"),
                                   ("e4m3fnuz", "e5m2fnuz")])
@pytest.mark.parametrize("amb,promote", [(None, None), (13, None), (13, 128), (7, 32)])
def test_fp32_within_bound_of_exact(fa, fb, amb, promote):
    rng = np.random.default_rng(5)
    M, N, K = 24, 40, 1000
    x = rng.standard_normal((M, K)) + 0.5  # a bias makes rounding errors add up
    y = rng.standard_normal((N, K)) + 0.5
    a = quantize(x, fa, scaling="block:128")
    b = quantize(y, fb, scaling="tile:128")
    exact = gemm(a, b, out_dtype=np.float64)
    c = gemm(a, b, accumulate="fp32", accumulator_mantissa_bits=amb, promote_interval=promote)
    bound = error_bound(K, fa, fb, block_k=128, promote_interval=promote,
                        accumulator_mantissa_bits=amb)
    err = np.abs(c - exact)
    assert np.all(err <= bound.model_bound(a, b))
    assert err.max() > 0  # the model does round
    if amb is not None and promote is None:
        # fewer accumulator bits: clearly larger errors than float32 accumulation
        c32 = gemm(a, b, accumulate="fp32")
        assert np.abs(c32 - exact).max() * 16 < err.max()


@pytest.mark.parametrize("fa,fb", FMT_PAIRS)
def test_total_error_against_unquantized_product(fa, fb):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((17, 300))
    y = rng.standard_normal((9, 300)) * 3
    sa = "mx_up:32" if fa in MX_FORMATS else "block:32"
    a = quantize(x, fa, scaling=sa)
    b = quantize(y, fb, scaling="tile:64")
    bound = error_bound(300, fa, fb, block_k=32)
    for acc in ("exact", "fp32"):
        c = gemm(a, b, accumulate=acc)
        total = bound.total_bound(x, y, a, b)
        assert np.all(np.abs(c - x @ y.T) <= total)


def test_nn_layout_equals_nt():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((70, 300)).astype(np.float32)
    w = rng.standard_normal((300, 45)).astype(np.float32)  # (K, N)
    a = quantize(x, "e4m3", scaling="block:128")
    b_nn = quantize(w, "e4m3", scaling="block:128,axis=0")
    b_nt = quantize(np.ascontiguousarray(w.T), "e4m3", scaling="block:128")
    assert np.array_equal(b_nn.codes.T, b_nt.codes)
    for acc in ("exact", "fp32"):
        assert np.array_equal(gemm(a, b_nn, accumulate=acc, layout="NN"),
                              gemm(a, b_nt, accumulate=acc))
    np.testing.assert_allclose(reference_gemm(a, b_nn, layout="NN"), reference_gemm(a, b_nt))


def test_exact_matches_float64_reference_at_size():
    rng = np.random.default_rng(4)
    a = quantize(rng.standard_normal((130, 513)), "e5m2", scaling="block:128")
    b = quantize(rng.standard_normal((67, 513)), "hif8", scaling="tile:128")
    ref = reference_gemm(a, b)
    c = gemm(a, b, out_dtype=np.float64)
    mag = np.abs(a.dequantize(np.float64)) @ np.abs(b.dequantize(np.float64)).T
    assert np.all(np.abs(c - ref) <= 513 * 2.0**-53 * mag)


def test_special_codes_propagate():
    x = np.ones((3, 8))
    x[1, 2] = np.nan
    a = quantize(x, "e5m2", scaling="tensor,pow2")
    y = np.ones((2, 8))
    y[0, 0] = np.inf
    b = quantize(y, "e5m2", scaling="channel,pow2")
    for acc in ("exact", "fp32"):
        c = gemm(a, b, accumulate=acc)
        assert np.isnan(c[1]).all()
        assert c[0, 0] == np.inf and c[2, 0] == np.inf
        assert c[0, 1] == 8.0 and c[2, 1] == 8.0


def test_bad_input_names_expected_shapes():
    a = quantize(np.ones((3, 5)), "e4m3")
    b = quantize(np.ones((4, 6)), "e4m3")
    with pytest.raises(ValueError, match=r"B must have shape \(N, 5\) for layout NT; got \(4, 6\)"):
        gemm(a, b)
    with pytest.raises(ValueError, match=r"B must have shape \(5, N\) for layout NN"):
        gemm(a, b, layout="NN")
    good = quantize(np.ones((4, 5)), "e4m3")
    with pytest.raises(ValueError, match="known: NT, NN"):
        gemm(a, good, layout="TN")
    with pytest.raises(ValueError, match="known: exact, fp32"):
        gemm(a, good, accumulate="fp16")
    with pytest.raises(ValueError, match="must be a QTensor"):
        gemm(np.ones((3, 5)), good)
    with pytest.raises(ValueError, match="must be 2-d"):
        gemm(quantize(np.ones((2, 3, 5)), "e4m3"), good)
    with pytest.raises(ValueError, match="promote_interval must be an int >= 1"):
        gemm(a, good, accumulate="fp32", promote_interval=0)
    with pytest.raises(ValueError, match=r"accumulator_mantissa_bits must be an int in 1..23"):
        gemm(a, good, accumulate="fp32", accumulator_mantissa_bits=24)
    with pytest.raises(ValueError, match="apply to accumulate='fp32' only"):
        gemm(a, good, promote_interval=128)
    with pytest.raises(ValueError, match="known: toward_zero, nearest_even"):
        gemm(a, good, accumulate="fp32", accumulator_rounding="up")


def test_error_bound_formula():
    u = 2.0**-24
    b = error_bound(1024, "e4m3", "e5m2", block_k=128)
    ga = 127 * u / (1 - 127 * u)
    gs = 8 * u / (1 - 8 * u)
    assert b.accumulation == pytest.approx(ga * (1 + u) + u + gs * (1 + u) * (1 + ga), rel=1e-12)
    assert (b.quantization_a, b.quantization_b) == (2.0**-4, 2.0**-3)
    assert b.absolute_a == 2.0**-10 and b.absolute_b == 2.0**-17
    assert error_bound(1024, "e4m3", "e4m3", accumulate="exact").accumulation == 0.0
    assert error_bound(1024, "hif8", "hif8").quantization_a == 2.0**-2
    with pytest.raises(ValueError, match="K must be >= 0"):
        error_bound(-1, "e4m3", "e4m3")
