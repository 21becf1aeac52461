"""LoKA dispatch: registry, perf database, choice, explain, refresh on drift, CLI."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from fp8lab.loka import Candidate, Probe, Site
from fp8lab.loka.dispatch import Dispatcher, RefreshPolicy
from fp8lab.loka.kernels import get_kernel, gpu_status, registry
from fp8lab.loka.perfdb import PerfDB, bucket
from fp8lab.loka.record import LayerNorm, Linear, ReLU, load_dump, record_sites, save_dump

E4T = Candidate("e4m3", "e4m3", "tensor")
E4C = Candidate("e4m3", "e4m3", "channel")


def _probe(sites_ops, cands=(E4T, E4C), n=60, **kw):
    probe = Probe([Candidate("high", "high"), *cands], p_max=0.05, delta=0.05, forget=1.0, **kw)
    for _ in range(n):
        for site, make in sites_ops:
            a, b = make()
            probe.observe(site, a, b)
    return probe


def test_registry_lists_gpu_kernels_with_reasons():
    names = [k.name for k in registry()]
    assert "numpy-f64" in names and "numpy-fp8-sim" in names
    gpu = [k for k in registry() if k.device == "cuda"]
    assert gpu
    ok, why = gpu_status()
    site = Site("s", 64, 64, 60)
    for k in gpu:
        avail, reason = k.available()
        assert avail == ok
        if not ok:
            assert reason.startswith("unavailable: ") and len(reason) > len("unavailable: ")
    site = Site("s", 64, 64, 60)
    hif = Candidate("hif8", "hif8", "tensor")
    assert "format hif8 not supported" in get_kernel("gpu-wgmma-fp8").supports(site, hif)
    assert get_kernel("gpu-wgmma-f16").supports(site, hif) is None
    assert "scaling mx" in get_kernel("gpu-wgmma-fp8").supports(Site("s", 64, 64, 64), Candidate("e4m3", "e4m3", "mx"))
    assert get_kernel("numpy-fp8-sim").supports(site, E4T) is None


def test_perfdb_atomic_roundtrip_and_rebuild(tmp_path):
    path = tmp_path / "perf.json"
    with pytest.warns(RuntimeWarning, match="missing"):
        db = PerfDB(path)
    db.put("numpy-f64", (100, 64, 3000), "cpu:test", 1.5e-3)
    assert [p.name for p in tmp_path.iterdir()] == ["perf.json"]  # no temporary left behind
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        db2 = PerfDB(path)
    assert db2.get("numpy-f64", (128, 64, 4096), "cpu:test") == 1.5e-3  # same bucket
    assert db2.get("numpy-f64", (256, 64, 4096), "cpu:test") is None
    path.write_text('{"version": 1, "entries": {"x": ')  # truncated write
    with pytest.warns(RuntimeWarning, match="corrupt"):
        db3 = PerfDB(path)
    assert db3.entries == {} and db3.rebuilt
    path.write_text(json.dumps({"version": 1, "entries": {"a|1x1x1|cpu": {"seconds": -1}}}))
    with pytest.warns(RuntimeWarning, match="corrupt"):
        PerfDB(path)
    assert bucket((1, 3, 1024)) == (1, 4, 1024)


def test_tiny_gemm_is_slow_and_gated():
    rng = np.random.default_rng(0)
    tiny = Site("tiny", 8, 8, 8)
    probe = _probe([(tiny, lambda: (rng.standard_normal((8, 8)), rng.standard_normal((8, 8))))])
    disp = Dispatcher(probe, gating=False)
    smap = disp.safety_map()["tiny"]["candidates"]
    # measured: casting two 8x8 operands costs more than the whole float64 GEMM
    assert smap["e4m3/e4m3:channel"]["class"].endswith("/Slow")
    assert smap["e4m3/e4m3:channel"]["time_s"] > smap["high"]["time_s"]
    assert disp.choose("tiny").candidate == "high"
    gated = Dispatcher(probe)
    assert "tiny GEMM" in gated.explain("tiny")


def test_choice_needs_safety_and_explain_says_why():
    rng = np.random.default_rng(1)

    def outliers():
        a = rng.standard_normal((64, 64))
        a[:2] *= 1e5
        return a, rng.standard_normal((64, 64))

    site = Site("o", 64, 64, 64)
    probe = _probe([(site, outliers)], tau=0.1, tau_row=0.1)
    db = PerfDB(None)
    dev = "test-device"
    # planted timings: 8-bit GEMM 4x faster than high precision, casts cheap
    db.put("numpy-f64", site.shape, dev, 4e-3)
    db.put("numpy-fp8-sim", site.shape, dev, 1e-3)
    for c in (E4T, E4C):
        for rows in (64,):
            db.put(f"numpy-fp8-sim:cast:e4m3:{c.scaling}", (rows, 64, 1), dev, 1e-4)
    disp = Dispatcher(probe, db, device=dev, autotime=False, gating=False)
    win = disp.choose("o")
    assert (win.candidate, win.kernel) == ("e4m3/e4m3:channel", "numpy-fp8-sim")
    assert abs(win.time_s - 1.2e-3) < 1e-12  # GEMM + two casts
    text = disp.explain("o")
    assert "WON" in text and "unsafe: P(rate > p_max)" in text and "lost: slower" in text
    smap = disp.safety_map()["o"]["candidates"]
    assert smap["e4m3/e4m3:tensor"]["class"] == "Unsafe/Fast"
    assert smap["e4m3/e4m3:channel"]["class"] == "Safe/Fast"
    # cached weights: no cast of B
    probe.state("o").site = Site("o", 64, 64, 64, cached=("weight",))
    assert abs(disp.choose("o").time_s - 1.1e-3) < 1e-12
    # global budget: zero error allowed -> high everywhere; generous -> the fast 8-bit option
    assert disp.choose_global(0.0)["o"].candidate == "high"
    assert disp.choose_global(1.0)["o"].candidate == "e4m3/e4m3:channel"


def test_hysteresis_keeps_current_choice():
    rng = np.random.default_rng(2)
    site = Site("h", 64, 64, 64)
    probe = _probe([(site, lambda: (rng.standard_normal((64, 64)), rng.standard_normal((64, 64))))],
                   cands=(E4C,))
    db, dev = PerfDB(None), "d"
    db.put("numpy-f64", site.shape, dev, 2e-3)
    db.put("numpy-fp8-sim", site.shape, dev, 1e-3)
    db.put("numpy-fp8-sim:cast:e4m3:channel", (64, 64, 1), dev, 1e-9)
    disp = Dispatcher(probe, db, device=dev, autotime=False, gating=False, hysteresis=0.1)
    assert disp.choose("h").candidate == "e4m3/e4m3:channel"
    db.put("numpy-f64", site.shape, dev, 0.95e-3)   # 5 % faster: inside the hysteresis band
    assert disp.choose("h").candidate == "e4m3/e4m3:channel"
    db.put("numpy-f64", site.shape, dev, 0.5e-3)    # 2x faster: switch
    assert disp.choose("h").candidate == "high"


def test_drifting_site_caught_by_refresh():
    rng = np.random.default_rng(3)
    site = Site("drift", 64, 64, 64)
    probe = Probe([Candidate("high", "high"), E4T, E4C], tau=0.1, tau_row=0.1, p_max=0.05,
                  delta=0.05, forget=0.995)
    disp = Dispatcher(probe, PerfDB(None), refresh=RefreshPolicy(every=1, jump=4.0), gating=False)
    b = rng.standard_normal((64, 64))
    for step in range(140):
        a = rng.standard_normal((64, 64))
        if step >= 80:
            a[:2] *= 1e5      # outlier rows appear mid-run
        disp.step(site, a, b, step)
        if step == 79:
            assert probe.report("drift")["e4m3/e4m3:tensor"]["safe"]
    assert [e[0] for e in disp.events] == [80] and "amax of A jumped" in disp.events[0][2]
    rep = probe.report("drift")
    assert not rep["e4m3/e4m3:tensor"]["safe"]
    # every one of the 60 post-drift batches exceeded (counts decay by forget=0.995 per trial)
    assert rep["e4m3/e4m3:tensor"]["trials"] == 60
    assert abs(rep["e4m3/e4m3:tensor"]["failures"] - (1 - 0.995 ** 60) / 0.005) < 1e-9


def test_rotating_refresh_schedule():
    pol = RefreshPolicy(every=10, per_round=2)
    due = [[i for i in range(5) if pol.rotating(s, i, 5)] for s in (0, 5, 10, 20, 30)]
    assert due == [[0, 1], [], [2, 3], [0, 4], [1, 2]]


def _dump(tmp_path):
    rng = np.random.default_rng(0)
    model = [Linear(rng.standard_normal((64, 32)) * 0.2), ReLU(),
             Linear(rng.standard_normal((64, 64)) * 0.1 + 0.05), LayerNorm(),
             Linear(rng.standard_normal((2, 64)))]
    recs = record_sites(model, rng.standard_normal((128, 32)))
    path = tmp_path / "dump.npz"
    save_dump(path, recs)
    return path, recs


def test_dump_roundtrip_both_layouts(tmp_path):
    path, recs = _dump(tmp_path)
    back = load_dump(path)
    assert [s for s, _, _ in back] == [s for s, _, _ in recs]
    for (_, a, b), (_, a2, b2) in zip(back, recs):
        assert np.array_equal(a, a2) and np.array_equal(b, b2)
    folder = tmp_path / "sites"
    folder.mkdir()
    s, a, b = recs[1]
    np.savez(folder / "mlp.npz", A=a, B=b)
    (folder / "mlp.json").write_text(json.dumps({"follow": "layernorm"}))
    (site, a2, _), = load_dump(folder)
    assert site.name == "mlp" and site.follow == "layernorm" and site.shape == (128, 64, 64)


def test_cli_in_process(tmp_path, capsys):
    import argparse

    from fp8lab.loka.cli import add_dispatch_parser, add_probe_parser

    path, _ = _dump(tmp_path)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_probe_parser(sub)
    add_dispatch_parser(sub)
    out = tmp_path / "map.json"
    args = parser.parse_args(["dispatch", str(path), "--batches", "4", "--batch-rows", "32",
                              "--formats", "e4m3", "--scalings", "tensor,channel",
                              "--json", str(out), "--perfdb", str(tmp_path / "p.json"),
                              "--explain", "layer2", "--global-budget", "0.1"])
    with pytest.warns(RuntimeWarning, match="missing"):
        assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "site layer2: chose" in text and "global budget" in text
    smap = json.loads(out.read_text())
    assert set(smap) == {"layer0", "layer2", "layer4"}
    assert smap["layer0"]["gate"].startswith("first layer")
    assert smap["layer2"]["site"]["follow"] == "layernorm"
    args = parser.parse_args(["probe", str(tmp_path / "nope.npz")])
    assert args.func(args) == 1
    assert "fp8lab: error:" in capsys.readouterr().err


def test_cli_subprocess(tmp_path):
    import fp8lab.cli as main_cli

    if "probe" not in getattr(main_cli, "COMMANDS", {}):
        pytest.skip("fp8lab.cli does not register the LoKA commands yet")
    path, _ = _dump(tmp_path)
    r = subprocess.run([sys.executable, "-m", "fp8lab", "probe", str(path), "--batches", "3",
                        "--batch-rows", "16", "--formats", "e4m3", "--scalings", "channel",
                        "--json", "-"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layer2"]["candidates"]["e4m3/e4m3:channel"]["class"] == "Unsafe"


def test_refresh_triggers_on_nan_and_saturation_burst():
    rng = np.random.default_rng(6)
    site = Site("t", 64, 64, 64)
    dl = Candidate("e4m3", "e4m3", "tensor", delayed=True)
    probe = Probe([Candidate("high", "high"), dl], tau=0.1)
    pol = RefreshPolicy(jump=1e9, sat_burst=1e-3)  # amax jumps alone never trigger here
    b = rng.standard_normal((64, 64))
    for _ in range(3):
        probe.observe(site, rng.standard_normal((64, 64)), b)
    assert pol.triggers(probe, "t", dl.label) == []
    a = rng.standard_normal((64, 64))
    a[3, 5] = np.nan
    probe.observe(site, a, b)
    assert any("NaN" in t for t in pol.triggers(probe, "t", dl.label))
    assert pol.triggers(probe, "t", dl.label) == []  # the same NaN is reported once
    probe.observe(site, 3 * rng.standard_normal((64, 64)), b)  # the history scale is now too small
    assert any("saturation burst" in t for t in pol.triggers(probe, "t", dl.label))


def test_prediction_prior_shortens_certification():
    """With the noise model's prior, a site predicted far inside the budget certifies in fewer
    measured batches; one predicted over budget starts Unsafe and needs the evidence."""
    rng = np.random.default_rng(7)
    site = Site("p", 64, 64, 64)
    c = Candidate("e4m3", "e4m3", "channel")

    def trials_to_safe(prior_weight, tau):
        probe = Probe([c], tau=tau, p_max=0.05, delta=0.05, forget=1.0, prior_weight=prior_weight)
        for i in range(1, 100):
            probe.observe(site, rng.standard_normal((64, 64)), rng.standard_normal((64, 64)))
            if probe.report("p")[c.label]["safe"]:
                return i
        return None

    assert trials_to_safe(0, 0.1) == 58
    assert trials_to_safe(30, 0.1) < 58           # predicted ~0.037 against a budget of 0.1
    assert trials_to_safe(30, 0.03) is None       # measured ~0.037 > 0.03: never Safe
