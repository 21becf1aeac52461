"""Figures for ``fp8lab analyze --plot DIR`` (matplotlib, an optional extra: ``fp8lab[plot]``).

Two kinds of PNG:

* ``hist_NNN_<tensor>.png``, one per tensor: the histogram of log2|x| (zeros, NaN and Inf left
  out and counted in the title) above one strip per format. A strip shows where the format's
  values fall once per-tensor scaling has mapped the tensor's largest magnitude onto the format's
  max: each binade is coloured by the mantissa bits it has (the precision there), subnormal
  (HiF8: denormal) binades are hatched, red marks overflow beyond max and grey the magnitudes that
  flush to zero. Every number drawn comes from the format's declaration (``fmt.binades``,
  ``fmt.finfo``).
* ``sqnr_heatmap.png``: SQNR in dB for every tensor (rows) x (format, scaling) (columns), the value
  written in each cell, the recommended choice of each tensor outlined.

matplotlib is imported only here, with the non-interactive Agg backend.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

__all__ = ["require_matplotlib", "plot_histogram", "plot_heatmap", "log2_histogram"]

_CHUNK = 1 << 20  # values per pass when histogramming, so memory stays small for big tensors
_BIN = 0.25  # histogram bin width in binades
_PRECISION_COLORS = ("#c6dbef", "#6baed6", "#2171b5", "#08306b")  # 0..3 mantissa bits
_OVERFLOW, _FLUSH = "#d62728", "#9e9e9e"


def require_matplotlib():
    """Import matplotlib with the Agg backend; ImportError with the install hint if missing."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib, an optional extra: pip install "
                          "'fp8lab[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def log2_histogram(x: np.ndarray):
    """(counts, edges, n_zero, n_nonfinite, amax) of log2|x| in bins of 1/4 binade, chunked."""
    flat = np.asarray(x).reshape(-1)
    lo, hi = -160.0, 130.0  # covers float32 and float64's usual range; clipped below
    edges = np.arange(lo, hi + _BIN, _BIN)
    counts = np.zeros(edges.size - 1, np.int64)
    n_zero = n_nonfinite = 0
    amax = 0.0
    for start in range(0, flat.size, _CHUNK):
        a = np.abs(np.asarray(flat[start:start + _CHUNK], dtype=np.float64))
        finite = np.isfinite(a)
        n_nonfinite += int(a.size - finite.sum())
        a = a[finite]
        nz = a > 0
        n_zero += int(a.size - nz.sum())
        a = a[nz]
        if a.size:
            amax = max(amax, float(a.max()))
            counts += np.histogram(np.clip(np.log2(a), lo, hi - 1e-9), bins=edges)[0]
    return counts, edges, n_zero, n_nonfinite, amax


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:80] or "tensor"


def plot_histogram(x, label: str, formats, out_dir, *, index: int = 0) -> str:
    """Write the log2|x| histogram of one tensor with each format's regions; returns the path."""
    plt = require_matplotlib()
    from matplotlib.patches import Patch, Rectangle

    os.makedirs(out_dir, exist_ok=True)
    counts, edges, n_zero, n_nonfinite, amax = log2_histogram(x)
    n = int(np.asarray(x).size)
    nonzero = np.nonzero(counts)[0]
    if nonzero.size:
        data_lo, data_hi = edges[nonzero[0]], edges[nonzero[-1] + 1]
    else:
        data_lo, data_hi = -1.0, 1.0
    # x-range: the data plus some room on either side for the formats' regions
    x_lo, x_hi = math.floor(data_lo) - 3, math.ceil(data_hi) + 3

    nf = len(formats)
    fig, (ax, strip) = plt.subplots(2, 1, sharex=True, figsize=(10, 3.6 + 0.45 * nf),
                                    gridspec_kw={"height_ratios": [3.2, 0.45 * nf + 0.4]})
    if nonzero.size:  # one filled step outline: cheap to draw however many bins
        keep = slice(nonzero[0], nonzero[-1] + 1)
        ax.stairs(counts[keep], edges[nonzero[0]:nonzero[-1] + 2], fill=True, color="#555555")
    ax.set_yscale("log" if counts.max(initial=0) > 50 else "linear")
    ax.set_ylabel("values per 1/4 binade")
    extra = []
    if n_zero:
        extra.append(f"{n_zero} zeros")
    if n_nonfinite:
        extra.append(f"{n_nonfinite} NaN/Inf")
    ax.set_title(f"{label}: magnitudes of {n:,} values"
                 + (f" ({', '.join(extra)} not shown)" if extra else ""), fontsize=11)
    if amax > 0:
        ax.axvline(math.log2(amax), color="black", linestyle="--", linewidth=1)
        ax.annotate("largest |x|", (math.log2(amax), 1), xycoords=("data", "axes fraction"),
                    xytext=(-4, -4), textcoords="offset points", ha="right", va="top",
                    fontsize=8)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)

    used_bits = set()
    has_sub = False
    for row, fmt in enumerate(formats):
        y = nf - 1 - row
        fi = fmt.finfo
        b = fmt.binades
        shift = math.log2(amax / fi.scale_target) if amax > 0 else 0.0  # per-tensor scale, log2
        log_max = math.log2(fi.max) + shift
        log_minsub = math.log2(fi.smallest_subnormal) + shift
        log_minnorm = math.log2(fi.smallest_normal) + shift
        spans: dict[tuple[int, bool], list] = {}  # (mantissa bits, subnormal) -> binades
        for k, mb in enumerate(b.mbits.tolist()):
            e = b.e_low + k
            lo, hi = e + shift, min(e + 1 + shift, log_max)
            sub = lo < log_minnorm - 1e-9
            has_sub |= sub
            used_bits.add(mb)
            spans.setdefault((mb, sub), []).append((lo, hi - lo))
        for (mb, sub), xr in spans.items():
            strip.broken_barh(xr, (y + 0.15, 0.7), facecolor=_PRECISION_COLORS[min(mb, 3)],
                              edgecolor="white", linewidth=0.5, hatch="////" if sub else None)
        # beyond max: overflow (Inf/NaN, or clamped with --saturate)
        strip.add_patch(Rectangle((log_max, y + 0.15), max(x_hi - log_max, 0), 0.7,
                                  facecolor=_OVERFLOW, alpha=0.35, edgecolor="none"))
        # below half the smallest subnormal everything rounds to zero; between half of it and
        # it, a value rounds either to zero or up to the smallest subnormal
        strip.add_patch(Rectangle((x_lo, y + 0.15), max(log_minsub - 1 - x_lo, 0), 0.7,
                                  facecolor=_FLUSH, alpha=0.45, edgecolor="none"))
        strip.add_patch(Rectangle((log_minsub - 1, y + 0.15), 1, 0.7,
                                  facecolor=_FLUSH, alpha=0.18, edgecolor="none"))
        ax.axvspan(log_max, x_hi, color=_OVERFLOW, alpha=0.04)
    strip.set_ylim(0, nf)
    strip.set_yticks([nf - 1 - r + 0.5 for r in range(nf)], [f.name for f in formats])
    strip.set_xlim(x_lo, x_hi)
    strip.set_xlabel("log2 |x|   (each format placed by per-tensor scaling: largest |x| "
                     "maps to the format's scale target, its max; 15 for hif8)")
    strip.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        strip.spines[side].set_visible(False)
        ax.spines[side].set_visible(False)

    handles = [Patch(facecolor=_PRECISION_COLORS[m], label=f"{m} mantissa bit{'s' if m != 1 else ''}")
               for m in sorted(used_bits)]
    if has_sub:
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch="////",
                             label="subnormal (HiF8: denormal)"))
    handles += [Patch(facecolor=_OVERFLOW, alpha=0.35, label="overflow: beyond max"),
                Patch(facecolor=_FLUSH, alpha=0.45, label="flushes to zero"),
                Patch(facecolor=_FLUSH, alpha=0.18, label="rounds to zero or to the smallest value")]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.07 + 0.01 * nf, 1, 1))
    path = os.path.join(os.fspath(out_dir), f"hist_{index:03d}_{_safe(label)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_heatmap(records, tensors_info, formats, scalings, out_dir) -> str:
    """Write the SQNR heatmap (tensors x (format, scaling)); returns the path."""
    plt = require_matplotlib()
    from matplotlib.patches import Rectangle

    os.makedirs(out_dir, exist_ok=True)
    labels = [t["label"] for t in tensors_info if any(r["label"] == t["label"] for r in records)]
    cols = [(f.name, str(s)) for f in formats for s in scalings]
    grid = np.full((len(labels), len(cols)), np.nan)
    picks = []
    for r in records:
        i, j = labels.index(r["label"]), cols.index((r["format"], r["scaling"]))
        grid[i, j] = r["sqnr_db"]
        if r["recommended"]:
            picks.append((i, j))
    finite = grid[np.isfinite(grid)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    shown = np.where(np.isposinf(grid), vmax, grid)  # exact (error 0) shows as the best colour

    fig_w = max(6.0, 1.0 + 0.85 * len(cols))
    fig_h = max(2.8, 1.6 + 0.38 * len(labels))
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    im = ax.imshow(shown, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(cols)), [f"{f}\n{s}" for f, s in cols], fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_xlabel("format / scaling recipe")
    ax.xaxis.set_label_position("top")
    if len(labels) <= 80:
        for i in range(len(labels)):
            for j in range(len(cols)):
                v = grid[i, j]
                text = "exact" if np.isposinf(v) else ("-" if not np.isfinite(v) else f"{v:.1f}")
                frac = 0.5 if not np.isfinite(v) else (shown[i, j] - vmin) / max(vmax - vmin, 1e-9)
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        color="white" if frac < 0.6 else "black")
    for i, j in picks:
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#ff7f0e",
                               linewidth=2.2))
    cbar = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cbar.set_label("SQNR (dB), higher is better")
    ax.set_title("SQNR per tensor; orange box: recommended (cheapest recipe meeting the budget)",
                 fontsize=9, pad=4, y=-0.08 - 0.2 / max(len(labels), 1))
    fig.tight_layout()
    path = os.path.join(os.fspath(out_dir), "sqnr_heatmap.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
