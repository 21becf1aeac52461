"""Hypothesis strategies for scaling, QTensor and GEMM tests (formats derived from the registry)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import fp8lab
from fp8lab.scaling import MX_ELEMENT_FORMATS, Scaling

FORMATS = fp8lab.list_formats()
MX_FORMATS = [f for f in FORMATS if f in MX_ELEMENT_FORMATS]
NON_MX_FORMATS = [f for f in FORMATS if f not in MX_ELEMENT_FORMATS]


@st.composite
def recipes(draw, ndim: int = 2, fmt: str | None = None) -> Scaling:
    """Any recipe valid for arrays of ``ndim`` dimensions (and format ``fmt`` if given)."""
    kinds = ["tensor"]
    if ndim >= 1:
        kinds += ["channel", "block"]
        if fmt is None or fmt in MX_ELEMENT_FORMATS:
            kinds.append("mx")
    if ndim >= 2:
        kinds.append("tile")
    kind = draw(st.sampled_from(kinds))
    pow2 = draw(st.booleans())
    margin = draw(st.integers(0, 2))
    axis = draw(st.integers(-ndim, ndim - 1)) if ndim else None
    block = draw(st.sampled_from([1, 3, 7, 32, 128]))
    if kind == "tensor":
        return Scaling.per_tensor(pow2=pow2, margin=margin)
    if kind == "channel":
        return Scaling.per_channel(axis, pow2=pow2, margin=margin)
    if kind == "block":
        return Scaling.per_block(block, axis, pow2=pow2, margin=margin)
    if kind == "tile":
        return Scaling.per_tile(block, pow2=pow2, margin=margin)
    return Scaling.mx(block, round_up=draw(st.booleans()), axis=axis, margin=margin)


def shapes(min_dims: int = 1, max_dims: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Small shapes, ragged ones included, and the awkward (303, 300)."""
    small = st.lists(st.integers(1, 40), min_size=min_dims, max_size=max_dims).map(tuple)
    return st.one_of(small, st.just((303, 300)), st.just((1, 257)), st.just((129, 1)))


@st.composite
def tensors(draw, shape) -> np.ndarray:
    """float32 values with a wide dynamic range (magnitudes 2^-30 .. 2^30), zeros included."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    spread = draw(st.sampled_from([0.0, 1.0, 4.0, 10.0]))
    x = rng.standard_normal(shape) * np.exp2(np.clip(rng.standard_normal(shape) * spread, -30, 30))
    x = x * 2.0 ** draw(st.integers(-20, 20))
    if draw(st.booleans()):
        x[rng.random(shape) < 0.05] = 0.0
    return x.astype(np.float32)
