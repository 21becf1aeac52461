"""Dispatch: per site, the fastest kernel whose candidate is Safe, with its reasons.

Time of an option = the kernel's GEMM time at the site's shape bucket + the cast of each operand
to 8 bits, unless the kernel fuses the cast or the operand's 8-bit copy is cached (``site.cached``).
Only measured times are used (:class:`~fp8lab.loka.perfdb.PerfDB`); CPU kernels are measured on
first need, GPU kernels only where a GPU is present.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .kernels import Kernel, registry
from .mods import gate
from .perfdb import PerfDB, bucket, device_name
from .sites import Candidate

__all__ = ["Option", "Dispatcher", "RefreshPolicy"]


@dataclasses.dataclass
class Option:
    candidate: str
    kernel: str
    status: str             # "ok", "unsafe", "unsupported", "unavailable", "gated", "untimed"
    reason: str = ""
    gemm_s: float = math.nan
    cast_s: float = 0.0
    p_unsafe: float = math.nan
    predicted: float = math.nan
    measured: float = math.nan

    @property
    def time_s(self) -> float:
        return self.gemm_s + self.cast_s

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["time_s"] = self.time_s
        return d


class RefreshPolicy:
    """When to re-measure a site.

    Every ``every`` steps the next ``per_round`` sites in rotation are re-measured; a site is
    re-measured at once, with its evidence reset, when an operand's amax moves by more than a
    factor ``jump`` against its history, when NaN/Inf appear, or when the chosen candidate's
    predicted saturation fraction exceeds ``sat_burst``.
    """

    def __init__(self, every: int = 100, per_round: int = 1, jump: float = 4.0,
                 sat_burst: float = 1e-3):
        self.every, self.per_round, self.jump, self.sat_burst = every, per_round, jump, sat_burst
        self._nan_seen: dict[str, int] = {}

    def triggers(self, probe, name: str, chosen: str | None) -> list[str]:
        st = probe.state(name)
        out = []
        for role, ops in (("A", st.stats.a), ("B", st.stats.b)):
            j = ops.amax_jump()
            if j > self.jump or j < 1 / self.jump:
                out.append(f"amax of {role} jumped x{j:.3g}")
        nan = st.stats.a.nan_count + st.stats.b.nan_count + st.stats.a.inf_count + st.stats.b.inf_count
        if nan > self._nan_seen.get(name, 0):
            out.append(f"{nan - self._nan_seen.get(name, 0)} NaN/Inf values")
        self._nan_seen[name] = nan
        if chosen and chosen in st.predicted:
            p = st.predicted[chosen]
            sat = max(p.overflow_frac_a, p.overflow_frac_b)
            if sat > self.sat_burst:
                out.append(f"saturation burst ({sat:.3g} of elements)")
        return out

    def rotating(self, step: int, index: int, n_sites: int) -> bool:
        if step % self.every:
            return False
        start = (step // self.every) * self.per_round % max(n_sites, 1)
        return (index - start) % max(n_sites, 1) < self.per_round


class Dispatcher:
    """Chooses a kernel per site from a probe's posteriors and a perf database."""

    def __init__(self, probe, perfdb: PerfDB | None = None, kernels=None, *,
                 device: str | None = None, hysteresis: float = 0.1, autotime: bool = True,
                 gating: bool = True, refresh: RefreshPolicy | None = None):
        self.probe = probe
        self.perfdb = perfdb if perfdb is not None else PerfDB(None)
        self.kernels = tuple(kernels) if kernels is not None else registry()
        self.device = device or device_name()
        self.hysteresis = hysteresis
        self.autotime = autotime
        self.gating = gating
        self.refresh = refresh or RefreshPolicy()
        self.current: dict[str, Option] = {}
        self.events: list[tuple[int, str, str]] = []

    # ------------------------------------------------------------------ timing
    def _rng_operand(self, shape, device="cpu", dtype=np.float64):
        x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
        if device == "cuda":
            import cupy

            return cupy.asarray(x)
        return x

    def device_of(self, k: Kernel) -> str:
        """Perf-database device key: this CPU, or the GPU as ``fp8lab.gpu`` describes it."""
        if k.device == "cpu":
            return self.device
        from .kernels import gpu_status

        ok, desc = gpu_status()
        return f"cuda:{desc}" if ok else "cuda:absent"

    def gemm_time(self, k: Kernel, shape) -> float | None:
        dev = self.device_of(k)
        t = self.perfdb.get(k.name, shape, dev)
        if t is None and self.autotime and k.gemm is not None and k.available()[0]:
            m, n, kk = bucket(shape)
            if k.formats == ("high",):
                dt = np.float64 if k.device == "cpu" else (
                    np.float16 if k.name.endswith("f16") else np.float32)
                a = self._rng_operand((m, kk), k.device, dt)
                b = self._rng_operand((n, kk), k.device, dt)
            elif k.device == "cpu":
                a = self._rng_operand((m, kk), dtype=np.float32)
                b = self._rng_operand((n, kk), dtype=np.float32)
            else:  # 8-bit codes on the GPU
                import cupy

                rng = cupy.random.default_rng(0)
                a = rng.integers(0, 120, (m, kk), dtype=cupy.uint8)
                b = rng.integers(0, 120, (n, kk), dtype=cupy.uint8)
            t = self.perfdb.measure(k.name, shape, dev, lambda: k.gemm(a, b))
        return t

    def cast_time(self, k: Kernel, cand: Candidate, rows: int, kk: int, fmt=None) -> float | None:
        fmt = fmt or cand.fmt_a
        name = f"{k.name}:cast:{fmt}:{cand.scaling}{':pow2' if cand.pow2 else ''}"
        shape = (rows, kk, 1)
        dev = self.device_of(k)
        t = self.perfdb.get(name, shape, dev)
        if t is None and self.autotime and k.cast is not None and k.available()[0]:
            r, c, _ = bucket(shape)
            x = self._rng_operand((r, c), k.device, np.float32)
            t = self.perfdb.measure(name, shape, dev,
                                    lambda: k.cast(x, fmt, cand.scaling, cand.pow2))
        return t

    # ------------------------------------------------------------------ options
    def options(self, name: str) -> list[Option]:
        st = self.probe.state(name)
        site = st.site
        gated = gate(site) if self.gating else None
        rep = self.probe.report(name)
        out = []
        for cand in self.probe.candidates:
            r = rep[cand.label]
            for k in self.kernels:
                o = Option(cand.label, k.name, "ok", p_unsafe=r["p_unsafe"],
                           predicted=(r["predicted"] or {}).get("rel_error", math.nan),
                           measured=(r["measured"] or {}).get("rel_error", math.nan))
                why = k.supports(site, cand)
                if why is not None:
                    if (k.formats == ("high",)) != cand.is_high:
                        continue  # a precision mismatch is not worth a line
                    o.status, o.reason = "unsupported", why
                    out.append(o)
                    continue
                ok, why = k.available()
                if not ok:
                    o.status, o.reason = "unavailable", why
                    out.append(o)
                    continue
                g = self.gemm_time(k, site.shape)
                if g is None:
                    o.status, o.reason = "untimed", "no measured time on this device"
                    out.append(o)
                    continue
                o.gemm_s = g
                if not cand.is_high and not k.fuses_cast:
                    for role, rows, fmt in zip(site.roles, (site.m, site.n), (cand.fmt_a, cand.fmt_b)):
                        if role in site.cached:
                            continue
                        c = self.cast_time(k, cand, rows, site.k, fmt)
                        o.cast_s += c if c is not None else math.inf
                if gated and not cand.is_high:
                    o.status, o.reason = "gated", gated
                elif not cand.is_high and not r["safe"]:
                    o.status = "unsafe"
                    o.reason = (f"P(rate > p_max) = {r['p_unsafe']:.3g} > delta = {self.probe.delta}"
                                f" after {r['trials']} trials ({r['failures']:.3g} exceedances)")
                out.append(o)
        return out

    def choose(self, name: str) -> Option:
        """Fastest Safe option; keeps the current choice within ``hysteresis`` of the best."""
        opts = [o for o in self.options(name) if o.status == "ok"]
        if not opts:
            raise RuntimeError(f"site {name!r}: no runnable option (not even high precision)")
        best = min(opts, key=lambda o: o.time_s)
        cur = self.current.get(name)
        if cur is not None:
            same = [o for o in opts if (o.candidate, o.kernel) == (cur.candidate, cur.kernel)]
            if same and same[0].time_s <= best.time_s * (1 + self.hysteresis):
                best = same[0]
        self.current[name] = best
        return best

    def high_time(self, name: str) -> float:
        ts = [o.time_s for o in self.options(name) if o.candidate == "high" and o.status == "ok"]
        return min(ts) if ts else math.inf

    def explain(self, name: str) -> str:
        """A table of every option at ``name`` and why it won or lost."""
        win = self.choose(name)
        opts = self.options(name)
        lines = [f"site {name}: chose {win.candidate} on {win.kernel} ({_fmt_t(win.time_s)})",
                 f"{'candidate':28} {'kernel':16} {'time':>10} {'pred err':>9} {'meas err':>9} "
                 f"{'P(unsafe)':>9}  verdict"]
        for o in sorted(opts, key=lambda o: (o.status != "ok", o.time_s if o.status == "ok" else 0)):
            if (o.candidate, o.kernel) == (win.candidate, win.kernel):
                verdict = "WON: fastest safe option"
            elif o.status == "ok":
                verdict = f"lost: slower ({_fmt_t(o.time_s)} vs {_fmt_t(win.time_s)})"
            else:
                verdict = f"lost: {o.reason}" if o.status == "unavailable" else f"lost: {o.status}: {o.reason}"
            lines.append(f"{o.candidate:28} {o.kernel:16} {_fmt_t(o.time_s):>10} "
                         f"{o.predicted:9.3g} {o.measured:9.3g} {o.p_unsafe:9.3g}  {verdict}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ global budget
    def choose_global(self, total_error: float) -> dict[str, Option]:
        """Spend a global error budget: sum over sites of the error of the chosen candidates
        (the larger of predicted and last measured) stays <= ``total_error``; greedy by time saved
        per unit of error. Each site still needs a Safe candidate under the probe's own budget."""
        choice, cands = {}, {}
        for name in self.probe.sites:
            opts = [o for o in self.options(name) if o.status == "ok"]
            high = min((o for o in opts if o.candidate == "high"), key=lambda o: o.time_s)
            choice[name] = high
            cands[name] = opts
        spent = 0.0

        def err(o):
            return 0.0 if o.candidate == "high" else max(_nz(o.predicted), _nz(o.measured))

        while True:
            best, best_gain = None, 0.0
            for name, opts in cands.items():
                cur = choice[name]
                for o in opts:
                    dt = cur.time_s - o.time_s
                    de = err(o) - err(cur)
                    if dt <= 0 or spent + de > total_error:
                        continue
                    gain = dt / max(de, 1e-12)
                    if gain > best_gain:
                        best, best_gain = (name, o, de), gain
            if best is None:
                return choice
            name, o, de = best
            choice[name] = o
            spent += de

    # ------------------------------------------------------------------ training loop
    def step(self, site, a, b, step: int) -> Option:
        """Per training step: statistics always; a measured trial when the refresh policy says so."""
        probe = self.probe
        probe.update_stats(site, a, b)
        probe.predict(site.name)
        names = list(probe.sites)
        cur = self.current.get(site.name)
        trig = probe.state(site.name).measured_steps and self.refresh.triggers(
            probe, site.name, cur.candidate if cur else None)
        if trig:
            probe.reset(site.name)
            self.events.append((step, site.name, "; ".join(trig)))
        if trig or probe.state(site.name).measured_steps == 0 or self.refresh.rotating(
                step, names.index(site.name), len(names)):
            probe.measure(site.name, a, b)
        return self.choose(site.name)

    # ------------------------------------------------------------------ safety map
    def safety_map(self) -> dict:
        """Per site and candidate: Safe/Unsafe x Fast/Slow with the evidence, and the choice."""
        out = {}
        for name, st in self.probe.sites.items():
            opts = self.options(name)
            high = self.high_time(name)
            rep = self.probe.report(name)
            cands = {}
            for cand in self.probe.candidates:
                runnable = [o for o in opts if o.candidate == cand.label and o.status in ("ok", "unsafe", "gated")]
                t = min((o.time_s for o in runnable), default=math.inf)
                r = rep[cand.label]
                fast = t < high
                cands[cand.label] = {
                    "class": ("Safe" if r["safe"] else "Unsafe") + "/" + ("Fast" if fast else "Slow"),
                    "safe": r["safe"], "fast": fast, "time_s": t, "high_time_s": high,
                    "p_unsafe": r["p_unsafe"], "trials": r["trials"], "failures": r["failures"],
                    "predicted": r["predicted"], "measured": r["measured"]}
            win = self.choose(name)
            out[name] = {"site": st.site.to_dict(), "gate": gate(st.site) if self.gating else None,
                         "choice": win.to_dict(), "candidates": cands}
        return out


def _nz(x: float) -> float:
    return 0.0 if x != x else x


def _fmt_t(t: float) -> str:
    if not math.isfinite(t):
        return "-"
    return f"{t * 1e6:.1f}us" if t < 1e-3 else f"{t * 1e3:.2f}ms"
