"""``fp8lab probe`` and ``fp8lab dispatch``: the LoKA engine on a recorded dump of site operands.

Both read a dump (see :mod:`fp8lab.loka.record` for the layout), draw ``--batches`` batches per
site (``--batch-rows`` rows of A sampled with replacement, B whole), run the probe on them and
write the safety map: a readable table on stdout, every number as JSON with ``--json FILE``.
``dispatch`` adds the kernel choice per site (perf database ``--perfdb``), ``--explain SITE``
and the global-budget variant ``--global-budget``. Exit status 0 ok, 1 runtime failure, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

__all__ = ["add_probe_parser", "add_dispatch_parser", "cmd_probe", "cmd_dispatch"]


def _common(p):
    p.add_argument("dump", metavar="DUMP", help=".npz dump or folder of per-site .npz files")
    p.add_argument("--formats", default="e4m3,e5m2", help="comma-separated (default e4m3,e5m2)")
    p.add_argument("--scalings", default="tensor,channel,block:128,mx",
                   help="comma-separated granularities (default tensor,channel,block:128,mx)")
    p.add_argument("--budget", type=float, default=0.05,
                   help="relative error budget tau after the following op (default 0.05)")
    p.add_argument("--row-budget", type=float, default=None, help="p99 row error budget")
    p.add_argument("--p-max", type=float, default=0.05, help="tolerated exceedance rate")
    p.add_argument("--delta", type=float, default=0.05, help="tolerated P(rate > p-max)")
    p.add_argument("--batches", type=int, default=64, help="batches per site (default 64)")
    p.add_argument("--batch-rows", type=int, default=256, help="rows of A per batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the safety map as JSON ('-': stdout)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")


def add_probe_parser(subparsers):
    p = subparsers.add_parser("probe", help="safety map of a recorded dump of GEMM sites",
                              description=__doc__.split("\n\n")[1])
    _common(p)
    p.set_defaults(func=cmd_probe)
    return p


def add_dispatch_parser(subparsers):
    p = subparsers.add_parser("dispatch", help="kernel choice per site of a recorded dump",
                              description=__doc__.split("\n\n")[1])
    _common(p)
    p.add_argument("--perfdb", metavar="FILE", help="perf database (created if missing)")
    p.add_argument("--explain", metavar="SITE", action="append", default=[],
                   help="print why each option at SITE won or lost ('all': every site)")
    p.add_argument("--global-budget", type=float, default=None,
                   help="spend this total error over all sites instead")
    p.set_defaults(func=cmd_dispatch)
    return p


def _err(msg: str) -> None:
    print(f"fp8lab: error: {msg}", file=sys.stderr)


def _run_probe(args):
    import numpy as np

    from .probe import Probe
    from .record import load_dump
    from .sites import HIGH, Candidate

    cands = [Candidate(HIGH, HIGH)]
    for f in args.formats.split(","):
        for g in args.scalings.split(","):
            cands.append(Candidate(f.strip(), f.strip(), g.strip()))
    if args.batches < 1 or args.batch_rows < 1:
        raise ValueError("--batches and --batch-rows must be >= 1")
    probe = Probe(cands, tau=args.budget, tau_row=args.row_budget, p_max=args.p_max,
                  delta=args.delta)
    rng = np.random.default_rng(args.seed)
    records = load_dump(args.dump)
    for site, a, b in records:
        rows = min(args.batch_rows, a.shape[0])
        import dataclasses

        s = dataclasses.replace(site, m=rows)
        for _ in range(args.batches):
            idx = rng.integers(0, a.shape[0], rows)
            probe.observe(s, a[idx], b)
    return probe


def _table(smap: dict) -> str:
    lines = [f"{'site':14} {'candidate':24} {'class':12} {'pred err':>9} {'meas err':>9} "
             f"{'p99 row':>9} {'P(unsafe)':>9} {'time':>10}"]
    for name, s in smap.items():
        for label, c in s["candidates"].items():
            pe = (c["predicted"] or {}).get("rel_error", math.nan)
            me = (c["measured"] or {}).get("rel_error", math.nan)
            mr = (c["measured"] or {}).get("p99_row_error", math.nan)
            t = c.get("time_s", math.nan)
            ts = "-" if t is None or not math.isfinite(t) else f"{t * 1e6:.0f}us"
            lines.append(f"{name:14} {label:24} {c['class']:12} {pe:9.3g} {me:9.3g} {mr:9.3g} "
                         f"{c['p_unsafe']:9.3g} {ts:>10}")
        if "choice" in s:
            ch = s["choice"]
            lines.append(f"{name:14} -> {ch['candidate']} on {ch['kernel']}"
                         + (f" (gated: {s['gate']})" if s.get("gate") else ""))
    return "\n".join(lines)


def _finite(x):
    """JSON has no NaN or Infinity: non-finite numbers (no measurement, no time) become null."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item"):  # numpy scalars
        return _finite(x.item())
    return x


def _write_json(path, data):
    text = json.dumps(_finite(data), indent=1, allow_nan=False)
    if path == "-":
        print(text)
    else:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")


def _guard(fn, args) -> int:
    try:
        return fn(args)
    except BrokenPipeError:
        raise  # the reader left (``| head``): the main CLI treats that as success
    except (ValueError, KeyError, FileNotFoundError, OSError) as exc:
        if getattr(args, "debug", False):
            raise
        _err(str(exc))
        return 1


def cmd_probe(args) -> int:
    """Run the probe; print the safety map (Safe/Unsafe only: no timing)."""
    def run(args):
        probe = _run_probe(args)
        smap = {}
        for name in probe.sites:
            rep = probe.report(name)
            smap[name] = {"site": probe.state(name).site.to_dict(), "candidates": {
                k: dict(v, **{"class": "Safe" if v["safe"] else "Unsafe"}) for k, v in rep.items()}}
        if args.json:
            _write_json(args.json, smap)
        if args.json != "-":
            print(_table(smap))
        return 0
    return _guard(run, args)


def cmd_dispatch(args) -> int:
    """Run the probe and the dispatcher; print choices, classes and explanations."""
    def run(args):
        from .dispatch import Dispatcher
        from .perfdb import PerfDB

        probe = _run_probe(args)
        disp = Dispatcher(probe, PerfDB(args.perfdb))
        smap = disp.safety_map()
        if args.global_budget is not None:
            g = disp.choose_global(args.global_budget)
            for name, o in g.items():
                smap[name]["global_choice"] = o.to_dict()
        if args.json:
            _write_json(args.json, smap)
        if args.json != "-":
            print(_table(smap))
            if args.global_budget is not None:
                for name in smap:
                    o = smap[name]["global_choice"]
                    print(f"global budget {args.global_budget}: {name} -> {o['candidate']} on {o['kernel']}")
            names = list(probe.sites) if "all" in args.explain else args.explain
            for name in names:
                print()
                print(disp.explain(name))
        return 0
    return _guard(run, args)


def main(argv=None) -> int:
    """Stand-alone entry (``python -m fp8lab.loka.cli probe ...``)."""
    parser = argparse.ArgumentParser(prog="fp8lab")
    sub = parser.add_subparsers(dest="command", required=True)
    add_probe_parser(sub)
    add_dispatch_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
