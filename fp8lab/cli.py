"""The ``fp8lab`` command line: a thin layer over the library.

Commands (``fp8lab COMMAND --help`` for each)::

    fp8lab formats                         every format and its limits
    fp8lab table FMT                       all 256 codes of a format
    fp8lab encode VALUE... --format FMT    what a format does to particular values
    fp8lab analyze PATH... | --demo        error analysis of tensors, format x scaling recipe

Every number printed comes from the public API (:func:`fp8lab.get_format`, :func:`fp8lab.encode`,
:func:`fp8lab.quantize`, :func:`fp8lab.metrics.error_metrics`); this module only chooses, orders
and formats. Data goes to stdout, diagnostics to stderr, each one line starting ``fp8lab:``.
Exit status: 0 success, 1 a runtime failure (some input could not be analysed), 2 a usage error.
Heavy or optional modules (the tensor readers, matplotlib) are imported only by the command that
needs them.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from fractions import Fraction

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

DEFAULT_FORMATS = "e4m3,e5m2,hif8"
DEFAULT_SCALINGS = "tensor,channel,block"
DEFAULT_BUDGET = "sqnr_db>=30,underflow_frac<=0.01"
OUTPUTS = ("table", "csv", "md", "json")

# Metrics shown in the analyze summary table: (ErrorMetrics field, column title, number format).
_SUMMARY_COLUMNS = (
    ("sqnr_db", "SQNR dB", "{:.2f}"),
    ("rel_error", "rel err", "{:.3g}"),
    ("p99_row_error", "p99 row", "{:.3g}"),
    ("overflow_frac", "overflow", "{:.3g}"),
    ("saturated_frac", "saturated", "{:.3g}"),
    ("underflow_frac", "underflow", "{:.3g}"),
)
# ErrorMetrics fields named by the contract; used when the class does not list its own.
_METRIC_FIELDS = ("sqnr_db", "rel_error", "cosine", "max_abs_error", "max_rel_error",
                  "row_p50_error", "row_p90_error", "p99_row_error", "ulp_max", "overflow_frac",
                  "saturated_frac", "underflow_frac", "nan_count", "inf_count", "n")


class UsageError(Exception):
    """A bad option value: reported as ``fp8lab: error: ...`` with exit status 2."""


class CommandError(Exception):
    """A runtime failure: reported as ``fp8lab: error: ...`` with exit status 1."""


# ===================================================================================== output
def _say(level: str, message: str) -> None:
    """One diagnostic line on stderr (never stdout: stdout is for data)."""
    print(f"fp8lab: {level}: {message}", file=sys.stderr, flush=True)


def _num(v) -> str:
    """A decoded value, exactly: Fractions of fp8 formats are dyadic, so repr(float) is exact."""
    if isinstance(v, Fraction):
        v = float(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(v)


def _pow2(v: float) -> str:
    """``v`` written as a power of two when it is one ("2^-9"), else its decimal value."""
    m, e = math.frexp(v)
    return f"2^{e - 1}" if m == 0.5 else _num(v)


def _json_safe(v):
    """Strict JSON has no NaN/Infinity: they are written as the strings "nan", "inf", "-inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return _num(v)
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
        return _json_safe(v.item())
    return v


def _dump_json(obj, fh) -> None:
    import json

    json.dump(_json_safe(obj), fh, indent=1, allow_nan=False)
    fh.write("\n")


def _render(rows: list[dict], columns: list[str], output: str, *, right: set[str] = frozenset(),
            json_rows: list[dict] | None = None) -> str:
    """Rows of strings as an aligned text table, CSV, Markdown or JSON (``json_rows`` if given)."""
    if output == "json":
        import io

        buf = io.StringIO()
        _dump_json(json_rows if json_rows is not None else rows, buf)
        return buf.getvalue()
    if output == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([r[c] for c in columns])
        return buf.getvalue()
    if output == "md":
        lines = ["| " + " | ".join(columns) + " |",
                 "|" + "|".join("---:" if c in right else "---" for c in columns) + "|"]
        lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
        return "\n".join(lines) + "\n"
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in columns}

    def line(cells):
        return "  ".join((str(cells[c]).rjust(widths[c]) if c in right
                          else str(cells[c]).ljust(widths[c])) for c in columns).rstrip()

    return "\n".join([line({c: c for c in columns})] + [line(r) for r in rows]) + "\n"


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ==================================================================================== formats
def _codes(codes) -> str:
    return " ".join(f"0x{c:02x}" for c in codes) or "none"


def _layout(fmt) -> str:
    d = fmt.declaration
    if fmt.kind == "binary":
        return f"S1 E{d['exponent_bits']} M{d['mantissa_bits']}, bias {d['bias']}"
    return "S1 Dot E M (tapered)"


def cmd_formats(args) -> int:
    import fp8lab

    rows, records = [], []
    for name in fp8lab.list_formats():
        fmt = fp8lab.get_format(name)
        fi = fmt.finfo
        rec = {"name": name, "layout": _layout(fmt), "max": fi.max,
               "smallest_normal": fi.smallest_normal,
               "smallest_subnormal": fi.smallest_subnormal, "eps": fi.eps,
               "n_finite": fi.n_finite, "zero_codes": list(fi.zero_codes),
               "nan_codes": list(fi.nan_codes), "inf_codes": list(fi.inf_codes),
               "max_code": fi.max_code, "default_rounding": fmt.default_rounding,
               "aliases": list(fmt.aliases)}
        records.append(rec)
        rows.append({"name": name, "layout": rec["layout"], "max": _num(fi.max),
                     "smallest_normal": _pow2(fi.smallest_normal),
                     "smallest_subnormal": _pow2(fi.smallest_subnormal),
                     "eps": _pow2(fi.eps), "n_finite": str(fi.n_finite),
                     "max_code": f"0x{fi.max_code:02x}", "zero_codes": _codes(fi.zero_codes),
                     "nan_codes": _codes(fi.nan_codes), "inf_codes": _codes(fi.inf_codes),
                     "default_rounding": fmt.default_rounding,
                     "aliases": ", ".join(fmt.aliases) or "-"})
    columns = ["name", "layout", "max", "smallest_normal", "smallest_subnormal", "eps",
               "n_finite", "max_code", "zero_codes", "nan_codes", "inf_codes",
               "default_rounding", "aliases"]
    if args.output == "table":
        # One column per format reads better on a terminal than 13 columns per format.
        names = [r["name"] for r in rows]
        t_rows = [{"property": c, **{n: r[c] for n, r in zip(names, rows)}} for c in columns[1:]]
        _write_stdout(_render(t_rows, ["property", *names], "table"))
    else:
        _write_stdout(_render(rows, columns, args.output, json_rows=records))
    return EXIT_OK


# ====================================================================================== table
def cmd_table(args) -> int:
    fmt = _format_arg(args.format)
    rows, records = [], []
    for c in range(256):
        v = fmt.values[c]
        rows.append({"code": f"0x{c:02x}", "bits": fmt.fields[c], "value": _num(v),
                     "class": fmt.classes[c]})
        records.append({"code": c, "hex": f"0x{c:02x}", "bits": fmt.fields[c],
                        "value": float(v), "class": fmt.classes[c]})
    _write_stdout(_render(rows, ["code", "bits", "value", "class"], args.output,
                          right={"value"}, json_rows=records))
    return EXIT_OK


def _format_arg(name: str):
    import fp8lab

    try:
        return fp8lab.get_format(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ===================================================================================== encode
_FLOAT_RE = re.compile(r"^[+-]?(\d[\d_]*\.?\d*|\.\d+)(e[+-]?\d+)?$|^[+-]?(inf|infinity|nan)$",
                       re.IGNORECASE)


def _parse_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    if "0x" in text.lower():
        try:
            return float.fromhex(text)  # 0x1.8p3
        except ValueError:
            pass
    try:
        return float(Fraction(text))  # 1/3
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"not a number: {text!r} (examples: 0.3, -1e6, 0x1.8p3, 1/3, inf, nan)")


def _neighbours(fmt, x: float) -> tuple[str, str]:
    """The representable values just below and just above ``x`` (strictly, when x is one)."""
    if math.isnan(x):
        return "-", "-"
    pos = fmt.positive_values
    finite = [-v for v in reversed(pos)] + [Fraction(0)] + list(pos)
    if math.isinf(x):  # the only neighbour of +inf is max (and of -inf, -max)
        below, above = ([finite[-1]], []) if x > 0 else ([], [finite[0]])
    else:
        below = [v for v in finite if v < x]
        above = [v for v in finite if v > x]
    # beyond +-max a finite input's next value out is the infinity, where the format has one
    lo = _num(below[-1]) if below else ("-inf" if fmt.inf_codes and math.isfinite(x) else "-")
    hi = _num(above[0]) if above else ("inf" if fmt.inf_codes and math.isfinite(x) else "-")
    return lo, hi


def cmd_encode(args) -> int:
    import numpy as np

    import fp8lab

    fmt = _format_arg(args.format)
    values = [_parse_value(t) for t in args.values]
    if args.rounding == "stochastic" and args.seed is None:
        raise UsageError("--rounding stochastic needs --seed N")
    try:
        codes = fp8lab.encode(np.array(values, dtype=np.float64), fmt, rounding=args.rounding,
                              saturate=args.saturate,
                              seed=args.seed if args.rounding == "stochastic" else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    decoded = fp8lab.decode(codes, fmt, dtype=np.float64)
    rows, records = [], []
    for text, x, c, d in zip(args.values, values, codes.tolist(), decoded.tolist()):
        exact = fmt.values[c]
        if isinstance(exact, Fraction) and math.isfinite(x):
            err = float(exact - Fraction(x))
            rel = float((exact - Fraction(x)) / Fraction(x)) if x != 0 else (0.0 if err == 0
                                                                             else math.inf)
        elif math.isnan(d) or math.isnan(x):
            err = rel = math.nan
        elif d == x:  # -0, or an infinity kept
            err = rel = 0.0
        else:  # overflow to an infinity: the error is infinite
            err = d - x
            rel = err / abs(x) if x != 0 else math.inf
        lo, hi = _neighbours(fmt, x)
        rows.append({"input": text, "code": f"0x{c:02x}", "bits": fmt.fields[c],
                     "value": _num(d), "class": fmt.classes[c], "error": f"{err:.6g}",
                     "rel_error": f"{rel:.6g}", "below": lo, "above": hi})
        records.append({"input": x, "code": c, "hex": f"0x{c:02x}", "bits": fmt.fields[c],
                        "value": d, "class": fmt.classes[c], "error": err, "rel_error": rel,
                        "below": lo, "above": hi})
    _write_stdout(_render(rows, ["input", "code", "bits", "value", "class", "error", "rel_error",
                                 "below", "above"], args.output,
                          right={"value", "error", "rel_error", "below", "above"},
                          json_rows=records))
    return EXIT_OK


# ==================================================================================== analyze
def _metric_fields() -> tuple[str, ...]:
    import dataclasses

    try:
        from .metrics import ErrorMetrics

        return tuple(f.name for f in dataclasses.fields(ErrorMetrics))
    except (ImportError, TypeError):
        return _METRIC_FIELDS


_BUDGET_RE = re.compile(r"^\s*([a-z_0-9]+)\s*(>=|<=|>|<)\s*([^\s]+)\s*$")


def parse_budget(text: str) -> list[tuple[str, str, float]]:
    """``"sqnr_db>=30,overflow_frac<=0"`` -> [("sqnr_db", ">=", 30.0), ...]; "30" means SQNR."""
    conds = []
    fields = _metric_fields()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            conds.append(("sqnr_db", ">=", float(part.removesuffix("dB").removesuffix("db"))))
            continue
        except ValueError:
            pass
        m = _BUDGET_RE.match(part)
        if not m:
            raise UsageError(f"bad --budget {part!r}; write METRIC>=VALUE or METRIC<=VALUE "
                             "joined by commas, e.g. 'sqnr_db>=30,overflow_frac<=0'; a bare "
                             "number means sqnr_db>=NUMBER")
        name, op, value = m.groups()
        if name not in fields:
            raise UsageError(f"unknown metric {name!r} in --budget; known: {', '.join(fields)}")
        try:
            conds.append((name, op, float(value)))
        except ValueError:
            raise UsageError(f"bad number {value!r} in --budget {part!r}") from None
    if not conds:
        raise UsageError("empty --budget")
    return conds


def _budget_text(conds) -> str:
    return ",".join(f"{n}{op}{v:g}" for n, op, v in conds)


def _meets(metrics: dict, conds) -> bool:
    for name, op, limit in conds:
        v = metrics[name]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return False
        if not {">=": v >= limit, "<=": v <= limit, ">": v > limit, "<": v < limit}[op]:
            return False
    return True


def _split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _parse_scalings(text: str):
    from .scaling import Scaling

    # Recipes are separated by commas, and a recipe's own options are too ("block:64,pow2"):
    # a piece that is not a recipe by itself belongs to the one before it.
    items: list[str] = []
    for t in _split_list(text):
        try:
            Scaling.parse(t)
            items.append(t)
        except (ValueError, TypeError):
            if items:
                items[-1] = f"{items[-1]},{t}"
            else:
                items.append(t)
    out = []
    for t in items:
        try:
            out.append(Scaling.parse(t))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"bad --scaling {t!r}: {exc}") from None
    if not out:
        raise UsageError("--scaling names no recipe")
    return out


def _quantize_fn():
    import fp8lab

    fn = getattr(fp8lab, "quantize", None)
    if fn is None:
        from .qtensor import quantize as fn
    return fn


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total_tensors: int, total_values: int, enabled: bool):
        import time

        self.enabled = enabled and total_tensors > 1
        self.total_tensors, self.total_values = total_tensors, max(total_values, 1)
        self.done_tensors = self.done_values = 0
        self.t0 = time.monotonic()
        self._last = 0.0
        self._time = time.monotonic

    def _draw(self, label: str = "", force: bool = False) -> None:
        if not self.enabled:
            return
        now = self._time()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        import shutil

        width = shutil.get_terminal_size((80, 20)).columns
        frac = self.done_values / self.total_values
        bar = "#" * int(frac * 20)
        rate = self.done_values / max(now - self.t0, 1e-9)
        text = (f"[{bar:<20}] {self.done_tensors}/{self.total_tensors} tensors "
                f"{_si(rate)} values/s {label}")
        sys.stderr.write("\r" + text[: width - 1].ljust(width - 1))
        sys.stderr.flush()

    def start(self, label: str) -> None:
        self._draw(label, force=True)

    def advance(self, values: int) -> None:
        self.done_tensors += 1
        self.done_values += values
        self._draw()

    def clear(self) -> None:
        if self.enabled:
            import shutil

            sys.stderr.write("\r" + " " * (shutil.get_terminal_size((80, 20)).columns - 1) + "\r")
            sys.stderr.flush()

    def say(self, level: str, message: str) -> None:
        self.clear()
        _say(level, message)
        self._draw(force=True)


def _si(v: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f}{unit}"
    return f"{v:.0f}"


class NotApplicable(Exception):
    """A (format, scaling) pair that does not apply to a tensor: reported as a note."""


def analyze_tensor(x, formats, scalings, *, rounding=None, saturate=False, seed=None,
                   pool=None):
    """ErrorMetrics (or the exception raised) for every (format, scaling) pair, in that order.

    Each pair is ``fp8lab.quantize`` then ``fp8lab.metrics.error_metrics``: exactly what a user
    of the API would call. Pairs run on ``pool`` (threads; the kernels release the GIL).
    """
    from .metrics import error_metrics

    quantize = _quantize_fn()

    def one(pair):
        fmt, sc = pair
        try:
            # a recipe that cannot apply (MX with HiF8, tiles of a vector) is not a failure
            if hasattr(sc, "check_format"):
                sc.check_format(fmt)
            if hasattr(sc, "block_shape"):
                sc.block_shape(x.shape)
        except ValueError as exc:
            return NotApplicable(str(exc))
        try:
            # saturate is passed only when asked for, so that each recipe keeps its own
            # default (MX clamps, as its specification says)
            extra = {"saturate": True} if saturate else {}
            qt = quantize(x, fmt, scaling=sc, rounding=rounding, seed=seed, **extra)
            return error_metrics(x, qt, fmt=fmt)
        except (ValueError, TypeError, ArithmeticError) as exc:
            return exc

    pairs = [(f, s) for f in formats for s in scalings]
    if pool is None:
        return list(map(one, pairs))
    return list(pool.map(one, pairs))


def _demo_refs():
    from . import _io
    from .demo_data import demo_tensors

    tensors = demo_tensors()
    return [_io.TensorRef("<demo>", name, "float32", tuple(x.shape), (lambda x=x: x))
            for name, x in tensors.items()]


def cmd_analyze(args) -> int:
    import fp8lab

    from . import _io

    if not args.paths and not args.demo:
        raise UsageError("give tensor files or directories to analyse, or --demo for built-in "
                         "examples")
    formats = []
    for name in _split_list(args.formats):
        formats.append(_format_arg(name))
    if not formats:
        raise UsageError("--formats names no format")
    scalings = _parse_scalings(args.scaling)
    budget = parse_budget(args.budget)
    if args.rounding == "stochastic" and args.seed is None:
        raise UsageError("--rounding stochastic needs --seed N")
    if args.plot:
        from . import _plots

        try:
            _plots.require_matplotlib()  # fail now, not after an hour of analysis
        except ImportError as exc:
            raise CommandError(str(exc)) from None
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")

    quiet = args.quiet
    events = list(_io.scan(args.paths)) if args.paths else []
    if args.demo:
        events += _demo_refs()
    refs = [e for e in events if isinstance(e, _io.TensorRef)]
    progress = _Progress(len(refs), sum(r.size for r in refs),
                         enabled=sys.stderr.isatty() and not quiet)
    n_errors = 0
    for e in events:
        if isinstance(e, _io.Problem):
            if e.level == "error":
                n_errors += 1
                _say("error", e.message)
                if args.debug and e.exc is not None:
                    import traceback

                    traceback.print_exception(e.exc, file=sys.stderr)
            elif not quiet:
                _say("note", e.message)

    multi_file = len({r.file for r in refs}) > 1
    records, tensors_info, plot_data = [], [], []
    jobs = args.jobs or min(os.cpu_count() or 1, len(formats) * len(scalings))
    pool = None
    if jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fp8lab-analyze")
    try:
        for i, ref in enumerate(refs):
            label = f"{ref.file}:{ref.name}" if multi_file else ref.name
            progress.start(label)
            try:
                x = ref.load()
            except _io.InputError as exc:
                if args.debug:
                    raise
                n_errors += 1
                progress.say("error", str(exc))
                progress.advance(ref.size)
                continue
            # Numba's workqueue threading layer cannot take parallel kernels from two threads:
            # run the first tensor serially, which also tells us the layer in use.
            use_pool = pool if (i > 0 and _threads_ok()) else None
            results = analyze_tensor(x, formats, scalings, rounding=args.rounding,
                                     saturate=args.saturate, seed=args.seed, pool=use_pool)
            rows = []
            n_nan = n_inf = 0
            for (fmt, sc), res in zip([(f, s) for f in formats for s in scalings], results):
                where = f"{label}: {fmt.name} {sc}"
                if isinstance(res, NotApplicable):
                    if not quiet:
                        progress.say("note", f"{where}: not applicable: {_one_line(res)}")
                    continue
                if isinstance(res, Exception):
                    n_errors += 1
                    progress.say("error", f"{where}: {_one_line(res)}")
                    continue
                m = res.to_dict()
                n_nan, n_inf = int(m.get("nan_count", 0)), int(m.get("inf_count", 0))
                rec = {"file": ref.file, "tensor": ref.name, "dtype": ref.dtype,
                       "shape": list(ref.shape), "format": fmt.name, "scaling": str(sc),
                       "cost_rank": int(sc.cost_rank), **m,
                       "meets_budget": _meets(m, budget), "recommended": False,
                       "label": label}
                rows.append(rec)
            if n_nan or n_inf:
                n_errors += 1
                progress.say("error", f"{label}: holds {n_nan} NaN and {n_inf} Inf values "
                                      "(counted in nan_count / inf_count; the metrics cover the "
                                      "finite values)")
            pick = _recommend(rows, formats)
            if pick is not None:
                pick["recommended"] = True
            tensors_info.append({"file": ref.file, "tensor": ref.name, "dtype": ref.dtype,
                                 "shape": list(ref.shape), "n": ref.size, "nan_count": n_nan,
                                 "inf_count": n_inf, "label": label,
                                 "recommended": ({"format": pick["format"],
                                                  "scaling": pick["scaling"]}
                                                 if pick else None)})
            records.extend(rows)
            if args.plot:
                from . import _plots

                try:
                    path = _plots.plot_histogram(x, label, formats, args.plot, index=i)
                    plot_data.append(path)
                except OSError as exc:
                    raise CommandError(f"cannot write plots to {args.plot}: {_one_line(exc)}")
            del x
            progress.advance(ref.size)
    finally:
        progress.clear()
        if pool is not None:
            pool.shutdown(wait=True)

    if not refs and n_errors == 0:
        n_errors += 1
        _say("error", "no float tensors to analyse")

    options = {"paths": list(args.paths), "demo": bool(args.demo),
               "formats": [f.name for f in formats], "scaling": [str(s) for s in scalings],
               "budget": _budget_text(budget), "rounding": args.rounding,
               "saturate": bool(args.saturate), "seed": args.seed}
    if records or tensors_info:
        text = _summary(records, tensors_info, formats, scalings, budget)
        if args.json != "-":
            _write_stdout(text)
    if args.json:
        doc = {"fp8lab_version": fp8lab.__version__, "command": "analyze", "options": options,
               "tensors": [{k: v for k, v in t.items() if k != "label"} for t in tensors_info],
               "records": [{k: v for k, v in r.items() if k != "label"} for r in records],
               "errors": n_errors}
        if args.json == "-":
            _dump_json(doc, sys.stdout)
        else:
            try:
                with open(args.json, "w", encoding="utf-8") as fh:
                    _dump_json(doc, fh)
            except OSError as exc:
                raise CommandError(f"cannot write {args.json}: {_one_line(exc)}") from None
    if args.plot and records:
        from . import _plots

        try:
            _plots.plot_heatmap(records, tensors_info, formats, scalings, args.plot)
        except OSError as exc:
            raise CommandError(f"cannot write plots to {args.plot}: {_one_line(exc)}") from None
        if not quiet:
            _say("note", f"plots written to {args.plot}")
    return EXIT_FAILURE if n_errors else EXIT_OK


def _threads_ok() -> bool:
    try:
        import numba

        return numba.threading_layer() != "workqueue"
    except (ImportError, ValueError):  # no parallel kernel has run yet: be safe
        return False


def _recommend(rows: list[dict], formats) -> dict | None:
    """The cheapest recipe meeting the budget; among equals the highest SQNR, then format order."""
    order = {f.name: i for i, f in enumerate(formats)}
    ok = [r for r in rows if r["meets_budget"]]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["cost_rank"], -_sortable(r["sqnr_db"]), order[r["format"]]))


def _sortable(v) -> float:
    return -math.inf if v is None or math.isnan(v) else v


def _summary(records, tensors_info, formats, scalings, budget) -> str:
    rows = []
    for r in records:
        row = {"tensor": r["label"], "format": r["format"], "scaling": r["scaling"]}
        for key, title, spec in _SUMMARY_COLUMNS:
            v = r.get(key)
            row[title] = ("-" if v is None else "0" if v == 0 else
                          _num(v) if not math.isfinite(v) else spec.format(v))
        row["pick"] = "*" if r["recommended"] else ""
        rows.append(row)
    columns = ["tensor", "format", "scaling", *[t for _, t, _ in _SUMMARY_COLUMNS], "pick"]
    out = [_render(rows, columns, "table", right={t for _, t, _ in _SUMMARY_COLUMNS})]
    out.append("overflow, saturated, underflow: fractions of the tensor's values that became "
               "Inf/NaN, were clamped to max, or were flushed to zero.\n")
    out.append(f"\nrecommended (cheapest scaling meeting {_budget_text(budget)}; "
               "then the highest SQNR):\n")
    width = max(len(t["label"]) for t in tensors_info)
    picks = [t["recommended"] for t in tensors_info if t["recommended"]]
    fw = max([len(p["format"]) for p in picks], default=0)
    sw = max([len(p["scaling"]) for p in picks], default=0)
    for t in tensors_info:
        rec = t["recommended"]
        if rec:
            r = next(r for r in records if r["label"] == t["label"] and r["recommended"])
            out.append(f"  {t['label']:<{width}}  {rec['format']:<{fw}}  {rec['scaling']:<{sw}}  "
                       f"{_num_db(r['sqnr_db'])}\n")
        else:
            mine = [r for r in records if r["label"] == t["label"]]
            if mine:
                best = max(mine, key=lambda r: _sortable(r["sqnr_db"]))
                out.append(f"  {t['label']:<{width}}  none meets the budget; best: "
                           f"{best['format']} {best['scaling']} ({_num_db(best['sqnr_db'])})\n")
            else:
                out.append(f"  {t['label']:<{width}}  not analysed\n")
    return "".join(out)


def _num_db(v) -> str:
    return f"{v:.2f} dB" if math.isfinite(v) else f"{_num(v)} dB"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ===================================================================================== parser
# argparse (before Python 3.13) takes "-1e6" or "-inf" for an option; these are numbers.
_NEGATIVE_NUMBER = re.compile(r"^-(\d[\d_]*\.?\d*|\.\d+)(e[+-]?\d+)?$|^-(inf|infinity|nan)$|"
                              r"^-0x[0-9a-f.]+p[+-]?\d+$|^-\d+/\d+$", re.IGNORECASE)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error")
    parser = argparse.ArgumentParser(
        prog="fp8lab", description="Bit-exact 8-bit floating point: formats, codes and the "
        "error analysis of tensors.",
        epilog="Run 'fp8lab COMMAND --help' for a command's options.")
    # the top-level parser classifies every argument too, so it needs the matcher as well
    parser._negative_number_matcher = _NEGATIVE_NUMBER
    parser.add_argument("--version", action="version", version=f"fp8lab {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("formats", parents=[common], help="list every format and its limits",
                       description="Every declared format with its layout, limits and special "
                       "codes.")
    p.add_argument("--output", choices=OUTPUTS, default="table")

    p = sub.add_parser("table", parents=[common], help="all 256 codes of a format",
                       description="All 256 codes of FMT: hex, bits split by field (HiF8: "
                       "S|Dot|E|M), exact value, class.")
    p.add_argument("format", metavar="FMT", help="format name or alias, e.g. e4m3, hif8")
    p.add_argument("--output", choices=OUTPUTS, default="table")

    p = sub.add_parser("encode", parents=[common], help="encode values and show the rounding",
                       description="Encode VALUEs (float64, rounded once) into FMT: the code, its "
                       "bits, the decoded value, the error and the representable values either "
                       "side.")
    p.add_argument("values", nargs="+", metavar="VALUE",
                   help="numbers: 0.3, -1e6, 0x1.8p3, 1/3, inf, nan")
    p.add_argument("--format", "-f", required=True, metavar="FMT")
    p.add_argument("--rounding", choices=_rounding_modes(), default=None,
                   help="default: the format's own (nearest_even; nearest_away for HiF8)")
    p.add_argument("--saturate", action="store_true",
                   help="clamp overflow and Inf to the largest finite value")
    p.add_argument("--seed", type=int, default=None, help="seed for --rounding stochastic")
    p.add_argument("--output", choices=OUTPUTS, default="table")
    p._negative_number_matcher = _NEGATIVE_NUMBER

    p = sub.add_parser("analyze", parents=[common], aliases=["analyse"],
                       help="error analysis of tensors for each format x scaling recipe",
                       description="For every float32/float16/bfloat16 tensor in the given "
                       ".npy, .npz and .safetensors files (a directory: every such file in it), "
                       "quantize with every format x scaling recipe and report SQNR, relative "
                       "error, p99 row error, overflow/saturation/underflow fractions and the "
                       "cheapest recipe meeting --budget.")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument("--demo", action="store_true", help="analyse built-in example tensors")
    p.add_argument("--formats", default=DEFAULT_FORMATS,
                   help=f"comma-separated formats (default: {DEFAULT_FORMATS})")
    p.add_argument("--scaling", default=DEFAULT_SCALINGS,
                   help="comma-separated recipes: tensor, channel[:AXIS], block[:B], tile[:B], "
                   f"mx[:B], mx_up (default: {DEFAULT_SCALINGS})")
    p.add_argument("--budget", default=DEFAULT_BUDGET,
                   help="what the recommended recipe must meet: METRIC>=X or METRIC<=X joined by "
                   f"commas; a bare number means sqnr_db>=NUMBER (default: {DEFAULT_BUDGET})")
    p.add_argument("--rounding", choices=_rounding_modes(), default=None)
    p.add_argument("--saturate", action="store_true")
    p.add_argument("--seed", type=int, default=None, help="seed for --rounding stochastic")
    p.add_argument("--json", metavar="FILE",
                   help="write every number as JSON to FILE ('-': stdout, instead of the table)")
    p.add_argument("--plot", metavar="DIR", help="write PNG figures to DIR (needs matplotlib)")
    p.add_argument("--jobs", type=int, default=None,
                   help="threads analysing (format, scaling) pairs (default: CPU count)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar and no notes (errors are still shown)")
    # LoKA's commands (fp8lab probe / dispatch) live in fp8lab.loka.cli. Importing that package
    # takes seconds, so only those commands pay for it; the others list them in --help only.
    if _command_of(argv) in _LOKA_COMMANDS:
        from .loka.cli import add_dispatch_parser, add_probe_parser

        add_probe_parser(sub), add_dispatch_parser(sub)
    else:
        for name, text in _LOKA_COMMANDS.items():
            sub.add_parser(name, help=text, add_help=False)
    # fp8lab dlrm: the end-to-end example (fp8lab.examples.cli), parsed in full only when asked for
    if _command_of(argv) == "dlrm":
        from .examples.cli import add_parser as add_dlrm_parser

        add_dlrm_parser(sub)
    else:
        sub.add_parser("dlrm", help="train the example DLRM: float32 vs naive FP8 vs LoKA",
                       add_help=False)
    return parser


_LOKA_COMMANDS = {"probe": "safety map of a recorded dump of GEMM sites (LoKA)",
                  "dispatch": "kernel choice per site of a recorded dump (LoKA)"}


def _command_of(argv) -> str | None:
    """The subcommand named in ``argv`` (default ``sys.argv[1:]``): its first non-option word."""
    for a in sys.argv[1:] if argv is None else argv:
        if not a.startswith("-"):
            return a
    return None


def _version() -> str:
    import fp8lab

    return fp8lab.__version__


def _rounding_modes():
    from .formats import ROUNDING_MODES

    return ROUNDING_MODES


COMMANDS = {"formats": cmd_formats, "table": cmd_table, "encode": cmd_encode,
            "analyze": cmd_analyze, "analyse": cmd_analyze}
COMMANDS.update(probe=lambda args: args.func(args), dispatch=lambda args: args.func(args))
COMMANDS["dlrm"] = lambda args: args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failure, 2 usage)."""
    parser = build_parser(argv)
    args = parser.parse_args(argv)  # exits with status 2 on a usage error
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        if args.debug:
            raise
        _say("error", str(exc))
        return EXIT_USAGE
    except CommandError as exc:
        if args.debug:
            raise
        _say("error", str(exc))
        return EXIT_FAILURE
    except BrokenPipeError:
        # `fp8lab table e4m3 | head`: the reader left; that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        _say("error", "interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
        if args.debug:
            raise
        _say("error", f"{type(exc).__name__}: {_one_line(exc)} (rerun with --debug for the "
                      "traceback)")
        return EXIT_FAILURE
