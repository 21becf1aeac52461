"""Quantized collectives: schedules, the CPU emulation, its error against float64, bad input."""

import math
import subprocess
import sys

import numpy as np
import pytest

import fp8lab
from fp8lab.collectives import Compression, analysis, build_schedule, chunk_bounds, derive_seed, emulate
from fp8lab.collectives.schedule import ALGOS

FORMATS = fp8lab.list_formats()
RANKS = [1, 2, 3, 4, 5, 8, 16]


def _inputs(N, n, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal((N, n)) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- schedules
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("N", list(range(1, 18)))
def test_schedule_delivers_every_contribution_once(algo, N):
    """Walk the steps symbolically: each owner's chunk sums every rank exactly once, and after
    the gather every rank holds every chunk."""
    rs = build_schedule("reduce_scatter", algo, N)
    have = [[{r} for _ in range(N)] for r in range(N)]  # have[rank][chunk] = contributors
    for st in rs.steps:
        msgs = [(t.dst, {c: set(have[t.src][c]) for c in t.chunks}) for t in st.transfers]
        for dst, part in msgs:
            for c, contrib in part.items():
                assert not (have[dst][c] & contrib), "a contribution would be counted twice"
                have[dst][c] |= contrib
    for c in range(N):
        assert have[c][c] == set(range(N))
    ag = build_schedule("all_gather", algo, N)
    holds = [{r} for r in range(N)]
    for st in ag.steps:
        for t in st.transfers:
            assert set(t.chunks) <= holds[t.src], "forwarding a chunk not yet received"
        for t in st.transfers:
            holds[t.dst] |= set(t.chunks)
    assert all(h == set(range(N)) for h in holds)
    levels = (N - 1).bit_length()
    assert rs.hops == (N - 1 if algo == "ring" else levels)
    ar = build_schedule("all_reduce", algo, N)
    assert ar.steps == rs.steps + ag.steps


@pytest.mark.parametrize("n,N,B", [(0, 3, 4), (10, 3, 2), (1001, 5, 7), (3, 4, 2), (4096, 16, 128),
                                   (129, 1, 128)])
def test_chunk_bounds(n, N, B):
    b = chunk_bounds(n, N, B)
    assert len(b) == N + 1 and b[0] == 0 and b[-1] == n
    assert all(x <= y for x, y in zip(b, b[1:]))
    assert all(x % B == 0 for x in b[:-1] if x < n)
    blocks = [-(-(y - x) // B) for x, y in zip(b, b[1:])]
    assert max(blocks) - min(blocks) <= 1 and sum(blocks) == -(-n // B)


# ----------------------------------------------------------------------------- emulation
def _comps(fmt):
    return [Compression(fmt, block=7), Compression(fmt, block=32, rounding="stochastic", seed=5),
            Compression(fmt, block=16, pow2=True)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("algo", ALGOS)
def test_identical_ranks_and_rs_plus_ag_equals_ar(fmt, algo):
    for N, n in [(2, 50), (3, 1001), (5, 333), (4, 3), (8, 64)]:
        xs = _inputs(N, n, seed=N)
        for comp in _comps(fmt):
            ar = emulate.all_reduce(xs, comp, algo=algo)
            assert ar.shape == (N, n) and ar.dtype == np.float32
            assert (ar.view(np.uint32) == ar[0].view(np.uint32)).all(), "ranks disagree"
            rs = emulate.reduce_scatter(xs, comp, algo=algo)
            b = chunk_bounds(n, N, comp.block)
            assert [c.size for c in rs] == [b[r + 1] - b[r] for r in range(N)]
            ag = emulate.all_gather(rs, comp, algo=algo)
            assert np.array_equal(ag.view(np.uint32), ar.view(np.uint32))


@pytest.mark.parametrize("algo", ALGOS)
def test_one_rank_is_exact(algo):
    x = _inputs(1, 1000, seed=3)
    for comp in _comps("e4m3"):
        assert np.array_equal(emulate.all_reduce(x, comp, algo=algo)[0], x[0])
        assert np.array_equal(emulate.reduce_scatter(x, comp, algo=algo)[0], x[0])
        assert np.array_equal(emulate.all_gather([x[0]], comp, algo=algo)[0], x[0])


def test_shapes_and_dtypes():
    import ml_dtypes
    xs = [np.full((3, 5, 7), r, dtype=ml_dtypes.bfloat16) for r in range(4)]
    out = emulate.all_reduce(xs, Compression("e4m3", block=16))
    assert out.shape == (4, 3, 5, 7)
    assert np.array_equal(out, np.full((4, 3, 5, 7), 6.0, np.float32))  # 0+1+2+3 all exact
    xs16 = np.ones((2, 10), np.float16)
    assert np.array_equal(emulate.all_reduce(xs16)[0], np.full(10, 2.0, np.float32))


# -- an independent reference of the documented ring, built from fp8lab.encode/decode only
def _ref_quantize(v, fmt, B, rounding, seed):
    M = fp8lab.finfo(fmt).scale_target  # the documented target amax maps to
    nb = -(-v.size // B)
    a = np.zeros(nb * B, np.float32)
    a[:v.size] = np.abs(v)
    amax = a.reshape(nb, B).max(axis=1)
    s = np.where(amax == 0, 1.0, (amax.astype(np.float64) / M).astype(np.float32)).astype(np.float32)
    se = np.repeat(s, B)[:v.size]
    codes = fp8lab.encode(v / se, fmt, rounding=rounding, saturate=True, seed=seed)
    return fp8lab.decode(codes, fmt) * se


@pytest.mark.parametrize("fmt,rounding", [("e4m3", None), ("hif8", "stochastic"),
                                          ("e5m2", "stochastic")])
def test_ring_matches_documented_order(fmt, rounding):
    N, n, B = 4, 203, 8
    xs = _inputs(N, n, seed=11)
    comp = Compression(fmt, block=B, rounding=rounding, seed=9 if rounding else None)
    mode = comp.rounding
    b = chunk_bounds(n, N, B)
    want = np.empty(n, np.float32)
    rs_want = []
    for c in range(N):
        sl = slice(b[c], b[c + 1])
        p = xs[(c + 1) % N, sl].copy()
        for k in range(1, N):  # rank c+k sends the partial at step k-1, rank c+k+1 adds
            src = (c + k) % N
            seed = derive_seed(9, "reduce", src, k - 1) if rounding else None
            p = _ref_quantize(p, fmt, B, mode, seed) + xs[(c + k + 1) % N, sl]
        rs_want.append(p)
        seed = derive_seed(9, "gather", c, 0) if rounding else None
        want[sl] = _ref_quantize(p, fmt, B, mode, seed)
    got_rs = emulate.reduce_scatter(xs, comp)
    for c in range(N):
        assert np.array_equal(got_rs[c], rs_want[c])
    assert np.array_equal(emulate.all_reduce(xs, comp)[0], want)


def test_seeds():
    xs = _inputs(4, 500, seed=2)
    a = emulate.all_reduce(xs, Compression("e4m3", rounding="stochastic", seed=1, block=32))
    b = emulate.all_reduce(xs, Compression("e4m3", rounding="stochastic", seed=1, block=32))
    c = emulate.all_reduce(xs, Compression("e4m3", rounding="stochastic", seed=2, block=32))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    keys = {derive_seed(s, ph, r, st) for s in (0, 1) for ph in ("reduce", "gather")
            for r in range(8) for st in range(8)}
    assert len(keys) == 2 * 2 * 8 * 8


# ----------------------------------------------------------------------------- error
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("algo", ALGOS)
def test_error_within_predicted_bound(fmt, algo):
    for N in (2, 5, 8):
        # mixed magnitudes across ranks and elements: exercises the scales and subnormal ranges
        xs = _inputs(N, 700, seed=N) * np.logspace(-3, 2, 700, dtype=np.float32)
        xs[:, 100:110] = 0.0
        for comp in _comps(fmt) + [Compression(fmt, block=64, rounding="toward_zero")]:
            for op in ("all_reduce", "reduce_scatter"):
                p = analysis.predict(xs, comp, op, algo)
                res = emulate.run(op, xs, comp, algo)
                got = res.outputs[0] if op == "all_reduce" else np.concatenate(res.outputs)
                err = np.abs(got.astype(np.float64) - p.exact)
                assert (err <= p.bound).all(), (N, comp, op, float((err / p.bound).max()))


@pytest.mark.parametrize("fmt,rounding", [("e4m3", None), ("e5m2", None), ("e4m3", "stochastic"),
                                          ("e5m2", "stochastic"), ("hif8", None)])
@pytest.mark.parametrize("algo", ALGOS)
def test_rms_matches_statistical_prediction(fmt, rounding, algo):
    xs = _inputs(8, 8192, seed=4)
    comp = Compression(fmt, block=128, rounding=rounding, seed=3 if rounding else None)
    m = analysis.measure(xs, comp, "all_reduce", algo)
    # 8192 elements, ~4-8 events each: the sampling error of the RMS is a few percent
    assert 0.85 < m["rms_measured"] / m["rms_predicted"] < 1.15, m


def test_ring_grows_faster_than_tree():
    xs = _inputs(16, 8192, seed=5)
    comp = Compression("e4m3", block=128)
    ring = analysis.measure(xs, comp, algo="ring")
    tree = analysis.measure(xs, comp, algo="tree")
    assert tree["rms_measured"] < 0.8 * ring["rms_measured"]
    assert tree["events"] == 5 and ring["events"] == 16


def test_stochastic_unbiased_nearest_biased():
    # 1.3 lies between the e4m3 values 1.25 and 1.375 (scale 1 from the 448 in each block):
    # nearest always rounds it down, stochastic rounds up with probability 0.4
    N, n = 2, 64
    x = np.zeros((N, n), np.float32)
    x[:, ::8] = 224.0  # 224 + 224 = 448: every block's amax maps to max, scale exactly 1
    x[0, 1::8] = 1.3
    sel = np.zeros(n, bool)
    sel[1::8] = True
    exact = x.astype(np.float64).sum(0)[sel]
    K = 300
    errs = np.stack([emulate.all_reduce(x, Compression("e4m3", block=8, rounding="stochastic",
                                                         seed=k))[0][sel] - exact
                     for k in range(K)])
    se = errs.std() / math.sqrt(errs.size)
    assert abs(errs.mean()) < 4 * se
    near = emulate.all_reduce(x, Compression("e4m3", block=8))[0][sel] - exact
    assert np.all(near < -0.04) and abs(near.mean()) > 20 * se


def test_stochastic_unbiased_random_data():
    xs = _inputs(4, 512, seed=8)
    exact = xs.astype(np.float64).sum(0)
    K = 64
    errs = np.stack([emulate.all_reduce(xs, Compression("e5m2", block=32, rounding="stochastic",
                                                         seed=k), algo="tree")[0] - exact
                     for k in range(K)])
    per_elem = errs.mean(axis=0) / (errs.std(axis=0, ddof=1) / math.sqrt(K) + 1e-30)
    assert abs(errs.mean()) < 4 * errs.std() / math.sqrt(errs.size)
    assert np.mean(np.abs(per_elem) > 3.3) < 0.01  # ~0.1% expected under no bias


# ----------------------------------------------------------------------------- bytes
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("N,n,B", [(4, 1000, 32), (8, 4096, 128), (3, 10, 4)])
def test_wire_bytes(algo, N, n, B):
    comp = Compression("e4m3", block=B)
    res = emulate.run("all_reduce", _inputs(N, n), comp, algo)
    w = analysis.wire_bytes(n, N, comp, "all_reduce", algo)
    assert max(res.wire_bytes) == w["fp8"]
    for phase, step, src, dst, nbytes in res.messages:
        assert nbytes % 4 == 0 or nbytes == 0
    if algo == "ring":
        b = chunk_bounds(n, N, B)
        per_chunk = [-(-(b[c + 1] - b[c]) // 4) * 4 + 4 * -(-(b[c + 1] - b[c]) // B) for c in range(N)]
        # rank r sends every chunk but its own in the reduce phase, every chunk but r+1's in
        # the gather phase
        size = [b[c + 1] - b[c] for c in range(N)]
        assert w["fp8"] == max(2 * sum(per_chunk) - per_chunk[r] - per_chunk[(r + 1) % N]
                               for r in range(N))
        assert w["bf16"] == max(2 * (2 * n - size[r] - size[(r + 1) % N]) for r in range(N))


# ----------------------------------------------------------------------------- bad input
def test_bad_input_names_what_is_expected():
    with pytest.raises(ValueError, match="unknown format 'e4m4'; known: e4m3"):
        Compression("e4m4")
    with pytest.raises(ValueError, match="block must be an int >= 1"):
        Compression("e4m3", block=0)
    with pytest.raises(ValueError, match="needs seed="):
        Compression("e4m3", rounding="stochastic")
    with pytest.raises(ValueError, match="only used by rounding='stochastic'"):
        Compression("e4m3", seed=3)
    with pytest.raises(ValueError, match="unknown rounding mode 'up'; known: nearest_even"):
        Compression("e4m3", rounding="up")
    with pytest.raises(ValueError, match="unknown algorithm 'star'; known: ring, tree"):
        emulate.all_reduce(_inputs(2, 4), algo="star")
    with pytest.raises(ValueError, match="unknown collective 'broadcast'; known: all_reduce"):
        build_schedule("broadcast", "ring", 2)
    with pytest.raises(ValueError, match=r"rank 1 has shape \(5,\), rank 0 has \(4,\)"):
        emulate.all_reduce([np.zeros(4, np.float32), np.zeros(5, np.float32)])
    with pytest.raises(TypeError, match="rank 0 holds float64; accepted: float32, float16 or bfloat16"):
        emulate.all_reduce(np.zeros((2, 4)))
    with pytest.raises(TypeError, match="holds int64"):
        emulate.all_reduce([np.arange(4), np.arange(4)])
    with pytest.raises(ValueError, match="must be finite"):
        emulate.all_reduce(np.array([[1, np.nan], [0, 0]], np.float32))
    with pytest.raises(ValueError, match="empty"):
        emulate.all_reduce([])
    with pytest.raises(TypeError, match="compression must be a Compression"):
        emulate.all_reduce(_inputs(2, 4), "e4m3")
    with pytest.raises(ValueError, match=r"chunk sizes \[3, 3\] do not match .* expected \[4, 2\]"):
        emulate.all_gather([np.zeros(3, np.float32)] * 2, Compression(block=2))
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        build_schedule("all_reduce", "ring", 0)


def test_nccl_path_refuses_clearly_without_gpus():
    from fp8lab.collectives import nccl
    ok, why = nccl.available(2)
    if ok:
        pytest.skip("GPUs present: the refusal path is not reachable")
    assert why
    with pytest.raises(RuntimeError, match="cannot run 2 NCCL ranks here: "):
        nccl.launch(print, 2)


def test_import_is_light():
    code = ("import sys, fp8lab.collectives, fp8lab.collectives.nccl; "
            "print(any(m.split('.')[0] in ('cupy', 'numba') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
