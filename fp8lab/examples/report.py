"""The experiment's report: a markdown summary and two PNG figures.

- ``curves.png``: training logloss per step (a 25-step running mean) for float32, naive FP8 and
  LoKA, one line per seed, the teacher's (best achievable) held-out logloss as a dashed line.
- ``safety_map.png``: LoKA's safety map of one seed: sites (rows) x candidates (columns), green
  Safe / red Unsafe / grey gated, the last measured relative error written in each cell and the
  chosen candidate outlined.

matplotlib is an optional extra (``pip install 'fp8lab[plot]'``) imported only when a figure is
drawn; :func:`results_table` and :func:`markdown_report` need nothing beyond the standard library.
"""

from __future__ import annotations

import os

__all__ = ["results_table", "per_seed_table", "markdown_report", "write_report", "plot_curves",
           "plot_safety_map"]

_LABEL = {"float32": "float32", "fp8": "naive FP8", "loka": "LoKA"}


def _pm(s: dict, fmt: str = ".4f", scale: float = 1.0) -> str:
    return f"{s['mean'] * scale:{fmt}} ± {s['std'] * scale:{fmt}}"


def results_table(res: dict) -> str:
    """The results as a markdown table (mean ± sample standard deviation over seeds)."""
    summ = res["summary"]
    n = len(res["config"]["seeds"])
    lines = ["| run | AUC | logloss | NE | logloss vs float32 (paired) | GEMM FLOPs in 8 bits |",
             "|---|---|---|---|---|---|"]
    for mode in res["config"]["modes"]:
        s = summ.get(mode)
        if s is None:
            continue
        rel = s.get("rel_logloss_vs_float32")
        rel_s = "—" if mode == "float32" or rel is None else (
            f"{rel['mean'] * 100:+.3f}% ± {rel['std'] * 100:.3f}%")
        share = f"{s['flop_share_8bit']['mean'] * 100:.1f}%"
        if mode == "loka":
            share += (f" (after dispatch: "
                      f"{s['flop_share_8bit_after_dispatch']['mean'] * 100:.1f}%)")
        lines.append(f"| {_LABEL.get(mode, mode)} | {_pm(s['auc'])} | {_pm(s['logloss'], '.5f')} | "
                     f"{_pm(s['ne'])} | {rel_s} | {share} |")
    b = res["data"]["bayes"]
    lines.append(f"| teacher (best achievable) | {b['auc']:.4f} | {b['logloss']:.5f} | "
                 f"{b['ne']:.4f} | | |")
    lines.append("")
    lines.append(f"Mean ± sample standard deviation over {n} paired seeds "
                 f"({', '.join(map(str, res['config']['seeds']))}); held-out rows: "
                 f"{res['data']['n_test']}.")
    return "\n".join(lines)


def _kept_table(res: dict) -> list[str]:
    s = res["summary"].get("loka")
    if not s:
        return []
    kept = s["kept_high"]
    n = len(res["config"]["seeds"])
    out = ["| site | seeds kept in bf16 | why (one seed's reason) |", "|---|---|---|"]
    for site, k in sorted(kept.items()):
        out.append(f"| `{site}` | {k['seeds']}/{n} | {k['why']} |")
    if not kept:
        out.append("| (none) | | |")
    return out


def _choices_table(res: dict) -> list[str]:
    runs = [r for r in res["runs"] if r["mode"] == "loka"]
    if not runs:
        return []
    sites = list(runs[0]["choices"])
    out = ["| site | " + " | ".join(f"seed {r['seed']}" for r in runs) + " |",
           "|---|" + "---|" * len(runs)]
    for site in sites:
        out.append(f"| `{site}` | " + " | ".join(f"`{r['choices'].get(site, '?')}`" for r in runs)
                   + " |")
    return out


def per_seed_table(res: dict) -> str:
    """Per seed: float32's logloss and each other run's logloss relative to it (paired)."""
    modes = [m for m in res["config"]["modes"]]
    by = {(r["mode"], r["seed"]): r for r in res["runs"]}
    head = ["seed"] + [f"{_LABEL.get(m, m)} logloss" + ("" if m == "float32" else " (vs float32)")
                       for m in modes] + [f"{_LABEL.get(m, m)} 8-bit FLOPs" for m in modes
                                          if m != "float32"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for seed in res["config"]["seeds"]:
        f32 = by.get(("float32", seed))
        row = [str(seed)]
        for m in modes:
            r = by.get((m, seed))
            if r is None:
                row.append("—")
            elif m == "float32" or f32 is None:
                row.append(f"{r['logloss']:.5f}")
            else:
                rel = (r["logloss"] - f32["logloss"]) / f32["logloss"]
                row.append(f"{r['logloss']:.5f} ({rel * 100:+.3f}%)")
        for m in modes:
            if m != "float32":
                r = by.get((m, seed))
                row.append("—" if r is None else f"{r['flop_share_8bit'] * 100:.1f}%")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def markdown_report(res: dict, figures: dict | None = None) -> str:
    """The whole report as markdown (``figures``: name -> relative path of PNGs to reference)."""
    ec, summ = res["config"], res["summary"]
    parts = ["# DLRM trained in float32, naive FP8 and with LoKA", "",
             f"Command: `{res.get('command', '')}`", "",
             f"Model `{ec['model']}`, {ec['steps']} steps of batch {ec['batch']}, "
             f"LoKA warm-up {ec['warmup']} steps, refresh every {ec['refresh']}, "
             f"budget tau = {ec['tau']}. Total time {res['seconds']:.0f} s.", "",
             results_table(res), "", "Per seed:", "", per_seed_table(res), ""]
    g = summ.get("goal")
    if g:
        parts += [f"Goal (LoKA within 0.1% relative logloss of float32 with >= 70% of GEMM FLOPs "
                  f"in 8 bits): relative logloss {g['loka_rel_logloss'] * 100:+.3f}% "
                  f"({'met' if g['rel_logloss_within_0.1%'] else 'missed'}), 8-bit FLOP share "
                  f"{g['flop_share_8bit'] * 100:.1f}% "
                  f"({'met' if g['flop_share_at_least_70%'] else 'missed'}).", ""]
    if figures:
        for name, path in figures.items():
            parts += [f"![{name}]({path})", ""]
    kept = _kept_table(res)
    if kept:
        parts += ["## Sites LoKA kept in high precision (bf16)", ""] + kept + [""]
    ch = _choices_table(res)
    if ch:
        parts += ["## LoKA's choice per site", ""] + ch + [""]
    return "\n".join(parts)


def write_report(res: dict, folder: str) -> dict:
    """Write ``report.md`` (and the PNGs, if matplotlib is installed) to ``folder``."""
    figs = {}
    try:
        plot_curves(res, os.path.join(folder, "curves.png"))
        figs["training curves"] = "curves.png"
        if any(r["mode"] == "loka" for r in res["runs"]):
            plot_safety_map(res, os.path.join(folder, "safety_map.png"))
            figs["safety map"] = "safety_map.png"
    except ImportError as exc:
        import sys

        print(f"fp8lab: note: no figures ({exc})", file=sys.stderr)
    with open(os.path.join(folder, "report.md"), "w", encoding="utf-8") as fh:
        fh.write(markdown_report(res, figs))
    return figs


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("figures need matplotlib, an optional extra: pip install "
                          "'fp8lab[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _running_mean(xs, w=25):
    import numpy as np

    xs = np.asarray(xs, float)
    c = np.cumsum(np.insert(xs, 0, 0.0))
    out = np.empty_like(xs)
    for i in range(len(xs)):
        lo = max(0, i + 1 - w)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def plot_curves(res: dict, path: str) -> None:
    plt = _plt()
    colors = {"float32": "#1f77b4", "fp8": "#d62728", "loka": "#2ca02c"}
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=90)
    seen = set()
    for r in res["runs"]:
        lab = _LABEL.get(r["mode"]) if r["mode"] not in seen else None
        seen.add(r["mode"])
        ax.plot(_running_mean(r["losses"]), color=colors.get(r["mode"], "k"), lw=0.9,
                alpha=0.8, label=lab)
    ax.axhline(res["data"]["bayes"]["logloss"], color="k", ls="--", lw=0.8,
               label="teacher (held-out)")
    w = res["config"]["warmup"]
    if "loka" in seen and w:
        ax.axvline(w, color=colors["loka"], ls=":", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training logloss (25-step mean)")
    ax.set_title(f"{len(res['config']['seeds'])} seeds per run")
    lo = min(min(_running_mean(r["losses"])[len(r["losses"]) // 5:]) for r in res["runs"])
    ax.set_ylim(min(lo, res["data"]["bayes"]["logloss"]) - 0.01, 0.6)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_safety_map(res: dict, path: str, seed=None) -> None:
    import numpy as np

    plt = _plt()
    runs = [r for r in res["runs"] if r["mode"] == "loka"]
    run = runs[0] if seed is None else next(r for r in runs if r["seed"] == seed)
    sm = run["safety_map"]
    sites = list(sm)
    cands = []
    for s in sites:
        for c in sm[s]["candidates"]:
            if c not in cands:
                cands.append(c)
    val = np.full((len(sites), len(cands)), np.nan)
    txt = [[""] * len(cands) for _ in sites]
    for i, s in enumerate(sites):
        gated = sm[s]["gate"]
        for j, c in enumerate(cands):
            e = sm[s]["candidates"].get(c)
            if e is None:
                continue
            if c == "high":
                val[i, j] = 2
            elif gated:
                val[i, j] = 0.5
            else:
                val[i, j] = 1 if e["safe"] else 0
            m = (e.get("measured") or {}).get("rel_error")
            if m is not None and c != "high":
                txt[i][j] = f"{m:.2f}" if m < 10 else ">10"
    from matplotlib.colors import ListedColormap, BoundaryNorm

    cmap = ListedColormap(["#f4a6a6", "#cfcfcf", "#9fd89f", "#d9e6f5"])
    norm = BoundaryNorm([-0.5, 0.25, 0.75, 1.5, 2.5], cmap.N)
    h = 0.26 * len(sites) + 1.6
    fig, ax = plt.subplots(figsize=(1.0 * len(cands) + 2.6, h), dpi=80)
    ax.imshow(val, cmap=cmap, norm=norm, aspect="auto")
    for i in range(len(sites)):
        for j in range(len(cands)):
            if txt[i][j]:
                ax.text(j, i, txt[i][j], ha="center", va="center", fontsize=6)
        ch = sm[sites[i]]["choice"]["candidate"]
        if ch in cands:
            j = cands.index(ch)
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="k", lw=1.6))
    ax.set_xticks(range(len(cands)))
    ax.set_xticklabels([c.replace(":", "\n", 1) for c in cands], fontsize=6)
    ax.set_yticks(range(len(sites)))
    ax.set_yticklabels(sites, fontsize=6)
    ax.set_title(f"LoKA safety map, seed {run['seed']}: green Safe, red Unsafe, grey gated; "
                 "cell = measured rel. error; box = choice", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
