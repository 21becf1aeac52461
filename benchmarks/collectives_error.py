"""Error table of the quantized all-reduce (CPU emulation; bit-identical to the NCCL path).

For N ranks holding N(0, 1) float32 gradients, compares the all-reduced result with the float64
sum: measured RMS error, the statistical prediction, relative RMS, the largest ratio of the error
to the rigorous per-element bound (must be <= 1), and the wire bytes per element against bf16.

    python benchmarks/collectives_error.py                     # the table of docs/collectives.md
    python benchmarks/collectives_error.py --ranks 2 4 --formats e4m3 --n 4096
"""

from __future__ import annotations

import argparse
import sys
import time

from fp8lab.collectives import Compression, analysis


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--formats", nargs="+", default=["e4m3", "e5m2", "hif8"])
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 128, 1024])
    ap.add_argument("--roundings", nargs="+", default=["nearest", "stochastic"],
                    choices=["nearest", "stochastic"])
    ap.add_argument("--algos", nargs="+", default=["ring", "tree"], choices=["ring", "tree"])
    ap.add_argument("--n", type=int, default=1 << 14, help="elements per rank (default 16384)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        rows = analysis.error_table(args.ranks, args.formats, args.blocks, args.roundings,
                                    args.algos, n=args.n, seed=args.seed)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("| ranks | format | block | rounding | algo | hops | rel. RMS | RMS meas. / pred. "
          "| max err / bound | bytes/elem (bf16 = 2) |")
    print("|---:|---|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        b = Compression(r["fmt"], block=r["block"]).bytes_per_element
        print(f"| {r['ranks']} | {r['fmt']} | {r['block']} | {r['rounding']} | {r['algo']} "
              f"| {r['events']} | {r['rel_rms']:.4f} | {r['rms_measured'] / r['rms_predicted']:.3f} "
              f"| {r['max_err_over_bound']:.3f} | {b:.3f} |")
    bad = [r for r in rows if r["max_err_over_bound"] > 1.0]
    print(f"{len(rows)} rows in {time.perf_counter() - t0:.1f} s; {len(bad)} above the bound",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
