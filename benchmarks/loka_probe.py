"""LoKA evidence: probe overhead per training step, predicted-vs-measured table, calibration.

    python benchmarks/loka_probe.py [--quick] [--section overhead|prediction|calibration]

Prints Markdown tables (the ones in docs/loka.md). Every number is measured on this machine;
``OPENBLAS_NUM_THREADS=1`` is recommended on a shared machine (the timings are then stable).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from fp8lab.loka import Candidate, Posterior, Site, SiteStats, measure, predict
from fp8lab.loka.suite import DISTRIBUTIONS, make_operands


def overhead(quick: bool) -> None:
    """A numpy MLP training step (forward + both backward GEMMs per layer) with and without the
    probe's per-step statistics on every GEMM operand."""
    batch = 1024 if quick else 4096
    widths = [512, 256, 128] if quick else [1024, 1024, 512, 256]  # DLRM-DCNv2 top MLP widths
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i)
          for i, o in zip(widths[:-1], widths[1:])]
    x0 = rng.standard_normal((batch, widths[0])).astype(np.float32)

    def train_step(probe_stats):
        x, acts = x0, []
        for i, w in enumerate(ws):
            if probe_stats:
                probe_stats[i][0].update(x, w)
            acts.append(x)
            x = np.maximum(x @ w.T, 0)
        g = np.ones_like(x) / x.size
        for i in reversed(range(len(ws))):
            if probe_stats:
                probe_stats[i][1].update(g, ws[i].T)  # input-gradient GEMM g @ W = g @ (W.T).T
            gw = g.T @ acts[i]                  # weight gradient GEMM
            g = g @ ws[i]                       # input gradient GEMM
            ws[i] -= 1e-3 * gw
        return x

    steps = 5 if quick else 20
    for sample in (1 << 12, 1 << 14):
        stats_ = [(SiteStats(("tensor", "channel", "block:128"), sample=sample),
                   SiteStats(("tensor", "channel"), sample=sample)) for _ in ws]
        train_step(stats_)
        t0 = time.perf_counter()
        for _ in range(steps):
            train_step(None)
        base = (time.perf_counter() - t0) / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            train_step(stats_)
        probed = (time.perf_counter() - t0) / steps
        print(f"| {batch} x {'-'.join(map(str, widths))} | {sample} | {base * 1e3:.1f} ms | "
              f"{probed * 1e3:.1f} ms | {100 * (probed - base) / base:.1f} % |")


def prediction(quick: bool) -> None:
    m, n, k = (128, 64, 256) if quick else (512, 256, 1024)
    rows, pred, meas = [], [], []
    for d in DISTRIBUTIONS:
        for follow in ("none", "layernorm"):
            for f in ("e4m3", "e5m2", "hif8"):
                for g in ("tensor", "channel", "block:128", "mx"):
                    a, b = make_operands(d, m, n, k, seed=1)
                    site = Site("s", m, n, k, follow=follow)
                    ss = SiteStats((g,))
                    ss.update(a, b)
                    c = Candidate(f, f, g)
                    p, me = predict(site, ss, c), measure(site, a, b, c)
                    rows.append((d, follow, c.label, p.rel_error, me.rel_error,
                                 p.p99_row_error, me.p99_row_error))
                    pred.append(p.rel_error)
                    meas.append(me.rel_error)
    print(f"shape M x N x K = {m} x {n} x {k}\n")
    print("| distribution | follow | candidate | predicted | measured | ratio | pred p99 row | meas p99 row |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.4g} | {r[4]:.4g} | {r[3] / r[4]:.3f} | "
              f"{r[5]:.4g} | {r[6]:.4g} |")
    print("\n| distribution | median pred/meas | worst pred/meas | Spearman (pred, meas) |")
    print("|---|---|---|---|")
    for d in DISTRIBUTIONS:
        r = np.array([x[3] / x[4] for x in rows if x[0] == d])
        pr = [x[3] for x in rows if x[0] == d]
        me = [x[4] for x in rows if x[0] == d]
        worst = r[np.argmax(np.abs(np.log(r)))]
        print(f"| {d} | {np.median(r):.3f} | {worst:.3f} | {stats.spearmanr(pr, me).statistic:.3f} |")
    allr = np.array(pred) / np.array(meas)
    print(f"| all | {np.median(allr):.3f} | {allr[np.argmax(np.abs(np.log(allr)))]:.3f} | "
          f"{stats.spearmanr(pred, meas).statistic:.3f} |")


def calibration(quick: bool) -> None:
    print("| p_max | delta | trials | sites | declared Safe | Safe with true rate > p_max |")
    print("|---|---|---|---|---|---|")
    n_sites = 1000 if quick else 5000
    for p_max, n in ((0.05, 120), (0.05, 60), (0.01, 400)):
        delta, tau = 0.05, 0.05
        rng = np.random.default_rng(12345)
        mu = np.log(tau) + rng.uniform(-2.5, 0.5, n_sites)
        sigma = rng.uniform(0.1, 1.0, n_sites)
        p_true = stats.norm.sf((np.log(tau) - mu) / sigma)
        errs = np.exp(mu[:, None] + sigma[:, None] * rng.standard_normal((n_sites, n)))
        fails = (errs > tau).sum(axis=1)
        safe = []
        for f in fails:
            p = Posterior(p_max, delta, forget=1.0)
            p.fail, p.ok = float(f), float(n - f)
            safe.append(p.safe)
        safe = np.array(safe)
        bad = np.mean(p_true[safe] > p_max) if safe.any() else 0.0
        print(f"| {p_max} | {delta} | {n} | {n_sites} | {safe.sum()} | {bad:.4f} |")


def gpu(quick: bool, perfdb_path=None) -> None:
    """Measured GPU times of the registry's CUDA kernels at DLRM-DCNv2 shapes (batch 8192), with
    the cast of both operands, and the Fast/Slow class against the fastest 16/32-bit GEMM."""
    from fp8lab.loka import Candidate, Probe
    from fp8lab.loka.dispatch import Dispatcher
    from fp8lab.loka.kernels import gpu_status, registry
    from fp8lab.loka.perfdb import PerfDB

    ok, why = gpu_status()
    if not ok:
        print(f"no GPU: {why}")
        return
    print(f"device: {why}\n")
    disp = Dispatcher(Probe([Candidate("e4m3", "e4m3", "tensor")]), PerfDB(perfdb_path))
    shapes = [("bottom.0", 8192, 512, 13), ("bottom.1", 8192, 256, 512),
              ("top.0", 8192, 1024, 3456), ("top.1", 8192, 1024, 1024), ("top.2", 8192, 512, 1024),
              ("top.3", 8192, 256, 512), ("dcn", 8192, 512, 3456), ("tiny", 64, 64, 64),
              ("big", 16384, 4096, 4096)]
    ks = {k.name: k for k in registry() if k.device == "cuda"}
    eight = ("gpu-wgmma-fp8", "gpu-mma-f16")
    cand = Candidate("e4m3", "e4m3", "tensor")
    print("| site | M x N x K | cupy-f32 | cupy-f16 | " + " | ".join(f"{e} GEMM" for e in eight)
          + " | best 8-bit + casts (A, B) | cached B | class |")
    print("|---|---|---|---|" + "---|" * len(eight) + "---|---|---|")
    for name, m, n, k in shapes:
        site = Site(name, m, n, k)
        t32 = disp.gemm_time(ks["cupy-f32"], site.shape)
        t16 = disp.gemm_time(ks["cupy-f16"], site.shape)
        cells, best = [], None
        for e in eight:
            why = ks[e].supports(site, cand)
            if why:
                cells.append(f"unsupported: {why}")
                continue
            t = disp.gemm_time(ks[e], site.shape)
            cells.append(f"{t * 1e6:.0f} us")
            best = t if best is None else min(best, t)
        ca = disp.cast_time(ks["gpu-wgmma-fp8"], cand, m, k)
        cb = disp.cast_time(ks["gpu-wgmma-fp8"], cand, n, k)
        high = min(t32, t16)
        cls = ("Fast" if best + ca + cb < high else
               "Fast if B cached" if best + ca < high else "Slow")
        print(f"| {name} | {m} x {n} x {k} | {t32 * 1e6:.0f} us | {t16 * 1e6:.0f} us | "
              + " | ".join(cells) + f" | {(best + ca + cb) * 1e6:.0f} us | "
              f"{(best + ca) * 1e6:.0f} us | {cls} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--section", choices=("overhead", "prediction", "calibration", "gpu"),
                    action="append")
    ap.add_argument("--perfdb", help="perf database file for the gpu section")
    args = ap.parse_args()
    secs = args.section or ["overhead", "prediction", "calibration"]
    if "overhead" in secs:
        print("## Probe overhead per training step\n")
        print("| batch x widths | sampled elements | step | step + probe stats | overhead |")
        print("|---|---|---|---|---|")
        overhead(args.quick)
        print()
    if "prediction" in secs:
        print("## Predicted vs measured relative error\n")
        prediction(args.quick)
        print()
    if "calibration" in secs:
        print("## Calibration of Safe\n")
        calibration(args.quick)
    if "gpu" in (args.section or []):
        print("## GPU kernel times (perf database entries)\n")
        gpu(args.quick, args.perfdb)


if __name__ == "__main__":
    main()
