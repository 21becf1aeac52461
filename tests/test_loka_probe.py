"""LoKA probe: prediction accuracy, planted cases, calibration of the Safe verdict."""

import math

import numpy as np
import pytest
from scipy import special, stats

from fp8lab.loka import Candidate, Posterior, Probe, Site, SiteStats, measure, predict
from fp8lab.loka.emulate import apply_follow
from fp8lab.loka.mods import choose_scaling, recenter_for_layernorm
from fp8lab.loka.suite import DISTRIBUTIONS, make_operands
from fp8lab.formats import list_formats


def _pred_meas(site, a, b, cand):
    ss = SiteStats((cand.scaling,))
    ss.update(a, b)
    return predict(site, ss, cand), measure(site, a, b, cand)


def test_prediction_suite_median_and_rank():
    """Predicted vs measured over distributions x formats x scalings (docs/loka.md table)."""
    pred, meas = [], []
    for d in DISTRIBUTIONS:
        ratios = []
        for f in ("e4m3", "e5m2"):
            for g in ("tensor", "channel", "block:128", "mx"):
                a, b = make_operands(d, 128, 64, 256, seed=1)
                p, m = _pred_meas(Site("s", 128, 64, 256), a, b, Candidate(f, f, g))
                pred.append(p.rel_error)
                meas.append(m.rel_error)
                ratios.append(p.rel_error / m.rel_error)
        assert 0.75 <= np.median(ratios) <= 1.25, (d, ratios)
    assert stats.spearmanr(pred, meas).statistic >= 0.9


@pytest.mark.parametrize("fmt", list_formats())
def test_prediction_every_format_gaussian(fmt):
    a, b = make_operands("gaussian", 64, 64, 128, seed=2)
    p, m = _pred_meas(Site("s", 64, 64, 128), a, b, Candidate(fmt, fmt, "channel"))
    assert abs(p.rel_error / m.rel_error - 1) < 0.25


def _outlier_rows(seed=0, m=64, k=64):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k))
    a[:2] *= 1e5  # two huge rows set the per-tensor scale; the rest flush towards zero
    return a


def test_outlier_rows_tensor_unsafe_channel_safe():
    site = Site("outliers", 64, 64, 64)
    cands = [Candidate("e4m3", "e4m3", "tensor"), Candidate("e4m3", "e4m3", "channel")]
    probe = Probe(cands, tau=0.1, tau_row=0.1, p_max=0.05, delta=0.05, forget=1.0)
    rng = np.random.default_rng(1)
    b = rng.standard_normal((64, 64))
    for i in range(60):
        probe.observe(site, _outlier_rows(i), b)
    rep = probe.report("outliers")
    t, c = rep["e4m3/e4m3:tensor"], rep["e4m3/e4m3:channel"]
    # tensor-level error hides the damage; the p99 row error shows it, predicted and measured
    assert t["measured"]["p99_row_error"] > 0.2 and t["predicted"]["p99_row_error"] > 0.2
    assert t["predicted"]["flush_frac_a"] > 0.3
    assert c["measured"]["p99_row_error"] < 0.06 and c["predicted"]["p99_row_error"] < 0.06
    assert not t["safe"] and c["safe"]
    # Mods: the coarsest predicted-safe scaling is per channel
    st = probe.state("outliers").stats
    chosen, _ = choose_scaling(site, st, "e4m3", 0.1, tau_row=0.1)
    assert chosen.scaling == "channel"


def _offset_site(seed=0, m=64, n=128, k=64):
    rng = np.random.default_rng(seed)
    a = np.abs(rng.standard_normal((m, k)))          # post-ReLU activations: positive mean
    w = 0.2 * rng.standard_normal((n, k)) + 1.0     # weights with a large common component
    return a, w


def test_layernorm_amplified_site_predicted_and_fixed_by_recentering():
    a, w = _offset_site()
    cand = Candidate("e4m3", "e4m3", "tensor")
    ln, raw = Site("ln", 64, 128, 64, follow="layernorm"), Site("raw", 64, 128, 64)
    p_ln, m_ln = _pred_meas(ln, a, w, cand)
    _, m_raw = _pred_meas(raw, a, w, cand)
    assert m_ln.rel_error > 10 * m_raw.rel_error          # LayerNorm amplifies
    assert p_ln.amplification > 10
    assert abs(p_ln.rel_error / m_ln.rel_error - 1) < 0.25
    # re-centering the weight: LayerNorm output unchanged in float64 ...
    w2, _ = recenter_for_layernorm(w)
    y1 = apply_follow(a @ w.T, "layernorm")
    y2 = apply_follow(a @ w2.T, "layernorm")
    assert np.max(np.abs(y1 - y2)) < 1e-9
    # ... and the 8-bit error after LayerNorm falls
    p2, m2 = _pred_meas(ln, a, w2, cand)
    assert m2.rel_error < m_ln.rel_error / 3
    assert abs(p2.rel_error / m2.rel_error - 1) < 0.25


def test_recentering_is_not_offered_as_exact_for_rmsnorm():
    a, w = _offset_site()
    w2, _ = recenter_for_layernorm(w)
    y1 = apply_follow(a @ w.T, "rmsnorm")
    y2 = apply_follow(a @ w2.T, "rmsnorm")
    assert np.max(np.abs(y1 - y2)) > 0.1   # RMSNorm keeps offsets: the identity is LayerNorm's only


def test_delayed_scaling_saturation_predicted():
    rng = np.random.default_rng(3)
    site = Site("d", 64, 64, 64)
    probe = Probe([Candidate("e4m3", "e4m3", "tensor", delayed=True)], tau=0.1)
    b = rng.standard_normal((64, 64))
    for _ in range(4):
        probe.observe(site, rng.standard_normal((64, 64)), b)
    probe.observe(site, 8 * rng.standard_normal((64, 64)), b)  # amax grows 8x: history scale too small
    pr = probe.report("d")["e4m3/e4m3:tensor:delayed"]
    assert pr["predicted"]["overflow_frac_a"] > 0.05
    assert abs(pr["predicted"]["rel_error"] / pr["measured"]["rel_error"] - 1) < 0.25


def test_calibration_of_safe_declarations():
    """Many synthetic sites with known log-normal error distributions: among sites declared Safe,
    the fraction whose true exceedance rate is above p_max stays <= delta."""
    rng = np.random.default_rng(12345)
    tau, p_max, delta, n = 0.05, 0.05, 0.05, 120
    n_sites = 3000
    mu = np.log(tau) + rng.uniform(-2.5, 0.5, n_sites)
    sigma = rng.uniform(0.1, 1.0, n_sites)
    p_true = stats.norm.sf((np.log(tau) - mu) / sigma)
    errs = np.exp(mu[:, None] + sigma[:, None] * rng.standard_normal((n_sites, n)))
    fails = (errs > tau).sum(axis=1)
    safe = np.array([_declare(f, n, p_max, delta) for f in fails])
    assert safe.sum() > 300            # the test has power: many sites are declared Safe
    assert (p_true > p_max).sum() > 300
    false_safe = np.mean(p_true[safe] > p_max)
    assert false_safe <= delta, false_safe


def _declare(fails, n, p_max, delta):
    p = Posterior(p_max, delta, forget=1.0)
    for i in range(n):
        p.observe(i < fails)
    return p.safe


def test_posterior_closed_form_and_forgetting():
    p = Posterior(0.01, 0.05, forget=1.0)
    for _ in range(297):
        p.observe(False)
    assert not p.safe
    p.observe(False)
    assert p.safe and math.isclose(p.p_unsafe, 0.99 ** 299, rel_tol=1e-9)
    q = Posterior(0.05, 0.05, forget=0.9)        # effective sample size 10: never certifies
    for _ in range(500):
        q.observe(False)
    assert not q.safe
    assert math.isclose(q.p_unsafe, special.betaincc(1, 1 + q.ok, 0.05))


def test_probe_accepts_device_arrays():
    """CuPy operands (anything with .get() to the host) give the same numbers as numpy ones."""

    class Dev:
        def __init__(self, a):
            self.a = a

        def get(self):
            return self.a

    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((32, 64)), rng.standard_normal((16, 64))
    site = Site("dev", 32, 16, 64, follow="rmsnorm")
    reps = []
    for wrap in (lambda x: x, Dev):
        probe = Probe([Candidate("e5m2", "e5m2", "block:128")], stats_kw={"seed": 1})
        probe.observe(site, wrap(a), wrap(b))
        reps.append(probe.report("dev"))
    assert reps[0] == reps[1]
