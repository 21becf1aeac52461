"""The example DLRM: backward pass against finite differences, data reproducibility, training, and
the naive-FP8 and LoKA numerics (fp8lab.examples)."""

import numpy as np
import pytest

from fp8lab.examples.data import auc, logloss, make_click_data, normalized_entropy
from fp8lab.examples.dlrm import DLRM, DLRMConfig, bce_with_logits, dense_embedding_grad
from fp8lab.examples.train import (ExperimentConfig, Loka, NaiveFP8, fake_quantize,
                                   h200_model_time, quantize_dequantize, round_bf16, summarize,
                                   train_run)


@pytest.mark.parametrize("interaction", ["dcn", "dot"])
def test_backward_matches_finite_differences(interaction):
    cfg = DLRMConfig(num_dense=3, vocab_sizes=(5, 7), embed_dim=4, bottom=(6,),
                     interaction=interaction, cross_layers=2, cross_rank=3, top=(8, 5))
    m = DLRM(cfg, seed=1, dtype=np.float64)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3))
    ids = np.stack([rng.integers(0, 5, 6), rng.integers(0, 7, 6)], axis=1)
    y = (rng.random(6) < 0.5).astype(np.float64)
    _, dz = bce_with_logits(m.forward(x, ids), y)
    grads, eg = m.backward(dz)
    params = dict(m.dense_params())
    for i, (t, g) in enumerate(zip(m.tables, dense_embedding_grad(m, eg))):
        params[f"emb{i}"] = t
        grads[f"emb{i}"] = g
    assert set(grads) == set(params)
    h = 1e-6
    for name, p in params.items():
        num = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + h
            lp = bce_with_logits(m.forward(x, ids), y)[0]
            p[idx] = old - h
            lm = bce_with_logits(m.forward(x, ids), y)[0]
            p[idx] = old
            num[idx] = (lp - lm) / (2 * h)
        scale = max(np.abs(num).max(), 1e-8)
        assert np.abs(num - grads[name]).max() <= 1e-6 * scale + 1e-10, name


def test_every_gemm_goes_through_a_named_site():
    m = DLRM(DLRMConfig.tiny(), seed=0)
    seen = []

    class Rec:
        def gemm(self, spec, a, b):
            seen.append(spec.name)
            return a @ b.T

    rng = np.random.default_rng(0)
    z = m.forward(rng.standard_normal((4, 3)).astype(np.float32), rng.integers(0, 5, (4, 2)), Rec())
    m.backward(np.ones_like(z), Rec())
    assert sorted(seen) == sorted(s.name for s in m.gemm_specs())
    assert "bottom.0.dx" not in seen  # the input needs no gradient


def test_data_is_reproducible_and_the_teacher_is_best():
    a = make_click_data(n_train=3000, n_test=2000, seed=3)
    b = make_click_data(n_train=3000, n_test=2000, seed=3)
    c = make_click_data(n_train=3000, n_test=2000, seed=4)
    for f in ("dense", "sparse", "labels", "p_true"):
        assert np.array_equal(getattr(a.train, f), getattr(b.train, f))
        assert np.array_equal(getattr(a.test, f), getattr(b.test, f))
    assert not np.array_equal(a.train.labels, c.train.labels)
    assert 0.2 < a.ctr < 0.3
    # the teacher's probabilities beat a constant predictor
    assert a.bayes["logloss"] < logloss(a.test.labels, np.full(len(a.test), a.ctr))
    assert a.bayes["auc"] > 0.75
    assert normalized_entropy(a.test.labels, np.full(len(a.test), a.ctr), a.ctr) == pytest.approx(
        1.0, abs=0.06)
    # heavy tails and hot ids
    assert np.abs(a.train.dense).max() > 10 * np.percentile(np.abs(a.train.dense), 90)
    assert np.bincount(a.train.sparse[:, 0]).max() > 0.1 * len(a.train)


def test_auc_of_known_cases():
    assert auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "hif8"])
@pytest.mark.parametrize("gran", ["tensor", "channel"])
def test_fast_fake_quantize_equals_fp8lab_quantize(fmt, gran):
    rng = np.random.default_rng(0)
    for shape in [(303, 300), (7, 13), (5, 1)]:
        x = (rng.standard_t(3, size=shape) * rng.lognormal(0, 3, size=(shape[0], 1))).astype(
            np.float32)
        x[0] = 0.0
        assert np.array_equal(fake_quantize(x, fmt, gran), quantize_dequantize(x, fmt, gran))


def test_round_bf16_is_nearest_even():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 1e3
    x = np.concatenate([x, np.float32([0.0, -0.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8])])
    ref = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(round_bf16(x), ref)


def test_fp8_model_times_favour_fp8_only_where_native():
    big = (8192, 1024, 1024)
    assert h200_model_time("h200-fp8:tensor", *big) < h200_model_time("h200-hif8-f16", *big)
    # HiF8 decoded to fp16 saves bytes, not flops: it wins only where the GEMM is memory-bound
    assert h200_model_time("h200-hif8-f16", *big) > h200_model_time("h200-bf16", *big)
    small = (256, 64, 64)
    assert h200_model_time("h200-hif8-f16", *small) < h200_model_time("h200-bf16", *small)


@pytest.fixture(scope="module")
def mini_data():
    return make_click_data(DLRMConfig.mini(), n_train=6000, n_test=2000, seed=0)


def test_short_training_improves_logloss(mini_data):
    ec = ExperimentConfig(model="mini", steps=60, batch=64, lr=3e-3)
    r = train_run("float32", mini_data, ec, seed=0)
    assert np.mean(r["losses"][-15:]) < np.mean(r["losses"][:5]) - 0.01
    assert r["logloss"] < logloss(mini_data.test.labels, np.full(len(mini_data.test),
                                                                 mini_data.ctr))
    assert r["flop_share_8bit"] == 0.0


def test_naive_fp8_and_loka_run_and_report_flop_shares(mini_data):
    ec = ExperimentConfig(model="mini", steps=8, batch=64, seeds=(0,))
    runs = [train_run("float32", mini_data, ec, seed=0)]
    r = train_run("fp8", mini_data, ec, seed=0, numerics=NaiveFP8())
    assert r["flop_share_8bit"] == 1.0 and np.isfinite(r["logloss"])
    runs.append(r)
    # enough prior pseudo-trials that 4 measured batches can certify a site
    lk = Loka(warmup=4, refresh=0, prior_weight=80, probe_rows=32)
    r = train_run("loka", mini_data, ec, seed=0, numerics=lk)
    runs.append(r)
    assert 0.0 < r["flop_share_8bit"] < r["flop_share_8bit_after_dispatch"] < 1.0
    # precision gating: the first and logit layers stay in bf16, with the reason
    assert r["choices"]["bottom.0.fwd"] == "high"
    assert "first layer" in r["kept_high"]["bottom.0.fwd"]
    assert "logit layer" in r["kept_high"]["top.1.fwd"]
    sm = r["safety_map"]
    assert set(sm) == set(r["choices"])
    s = summarize({"runs": runs})
    assert set(s) >= {"float32", "fp8", "loka", "goal"}
    assert "rel_logloss_vs_float32" in s["loka"]


@pytest.mark.parametrize("fa,fb,gran", [("e4m3", "e4m3", "tensor"), ("e5m2", "e4m3", "channel")])
def test_emulated_site_is_an_fp8_gemm_with_fp32_accumulation(fa, fb, gran):
    """Spot check of one layer against fp8lab.gemm: the training loop's quantize-dequantize plus a
    float32 matmul equals the exact product of the same 8-bit operands up to float32 summation."""
    import fp8lab
    from fp8lab.gemm import gemm

    m = DLRM(DLRMConfig.small(), seed=0)
    rng = np.random.default_rng(0)
    lin = m.top[0]
    x = np.maximum(rng.standard_normal((64, lin.W.shape[1])), 0).astype(np.float32)
    from fp8lab.examples.train import _scaling

    qa = fp8lab.quantize(x, fa, scaling=_scaling(gran), saturate=True)
    qb = fp8lab.quantize(lin.W, fb, scaling=_scaling(gran), saturate=True)
    exact = gemm(qa, qb, accumulate="exact", out_dtype=np.float64)
    ours = fake_quantize(x, fa, gran) @ fake_quantize(lin.W, fb, gran).T
    k = x.shape[1]
    da, db = qa.dequantize(np.float64), qb.dequantize(np.float64)
    bound = k * 2.0 ** -23 * (np.abs(da) @ np.abs(db).T)
    assert np.all(np.abs(ours - exact) <= bound + 1e-30)


def test_cli_runs_the_experiment(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "fp8lab", "dlrm", "--model", "mini", "--steps", "3",
                        "--batch", "32", "--train-rows", "500", "--test-rows", "200",
                        "--seeds", "0", "--modes", "float32,fp8", "--json", str(out), "-q"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "| naive FP8 |" in p.stdout and p.stderr == ""
    res = json.loads(out.read_text())
    assert {r["mode"] for r in res["runs"]} == {"float32", "fp8"}
    bad = subprocess.run([sys.executable, "-m", "fp8lab", "dlrm", "--modes", "fp7"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown mode" in bad.stderr


def test_report_writes_markdown_and_figures(tmp_path, mini_data):
    pytest.importorskip("matplotlib")
    from fp8lab.examples.report import write_report
    from fp8lab.examples.train import summarize

    ec = ExperimentConfig(model="mini", steps=5, batch=32, seeds=(0,), warmup=2)
    runs = [train_run("float32", mini_data, ec, seed=0),
            train_run("loka", mini_data, ec, seed=0,
                      numerics=Loka(warmup=2, refresh=0, prior_weight=80, probe_rows=16))]
    res = {"config": {"seeds": [0], "modes": ["float32", "loka"], "model": "mini", "steps": 5,
                      "batch": 32, "warmup": 2, "refresh": 0, "tau": 0.08},
           "data": {"bayes": mini_data.bayes, "n_test": len(mini_data.test)},
           "runs": runs, "seconds": 1.0, "command": "test"}
    res["summary"] = summarize(res)
    figs = write_report(res, str(tmp_path))
    assert set(figs.values()) == {"curves.png", "safety_map.png"}
    text = (tmp_path / "report.md").read_text()
    assert "| LoKA |" in text and "first layer" in text
    for f in figs.values():
        assert (tmp_path / f).stat().st_size > 1000
