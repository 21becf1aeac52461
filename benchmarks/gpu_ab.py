"""Builds of gpu/gemm_wgmma.cu's plain GEMM side by side in one run, with cuBLASLt.

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_ab.py [--builds "base=;pf8=WG_PF=8"]
        [--shapes 65536x1024x1024,8192x8192x8192] [--cases e4m3,blk,grouped] [--rounds 3] [--graph]

A build is a name and the ``#define`` pairs it adds in front of the tree's source
(``name=A=1,B=2``); a pair whose name starts with ``@`` is a host setting instead, an attribute of
``fp8lab.gpu.gemm`` set while that build runs (``b192=@WIDE_FP8=192``: the same kernels, FP8 wide
tiles 192 wide; digits give an int, anything else a string); the build named ``saved`` compiles
gpu/gemm_wgmma_ab.cu instead (an earlier source with the same kernel arguments, e.g. ``git show
REV:gpu/gemm_wgmma.cu >
gpu/gemm_wgmma_ab.cu``; left untracked it travels to the device with the tree; delete it
afterwards: the nvcc test compiles every gpu/*.cu). Cases: ``e4m3`` (NT, per-tensor), ``blk``
(e4m3, block scales), ``grouped`` (64 GEMMs of the shape in one launch, per-tensor; cuBLASLt then
makes 64 calls), bfloat16 out, the library's tile choice; ``fused`` / ``fused2``: gemm_fused with
A in bfloat16 quantized on load at a device scale (amax / 448, or that rounded up to a power of
two), against torch's scaled cast ``(x * (1/s)).to(float8_e4m3fn)`` + ``torch._scaled_mm`` (the
ratio is then the speed-up over that). A build that sets ``QA_NB`` also sets the host's mirror
of it (``_QA_NB``, which sets the quantize-on-load's unit size). Every build's instances are compiled
first in parallel processes. Then, per round, each case is timed (CUDA events, median of 10;
``--graph``: GPU time of a CUDA graph of 10 calls, for launch-bound shapes) under every build in
turn, and cuBLASLt (``torch._scaled_mm``, per-tensor) beside it; the table gives the median over
rounds in TFLOPS and the ratio to cuBLASLt, and says whether each build's output equals the
first build's bit for bit.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp

_CASES = {"e4m3": "tensor", "row": "row_col", "blk": "block", "grouped": "tensor", "fused": "tensor", "fused2": "tensor"}
_FUSED = ("fused", "fused2")
_GROUP = 64


def _ref(case: str) -> str:
    """The baseline a case is timed against: torch's cast + cuBLASLt for the fused ones."""
    return "cast+lt" if case in _FUSED else "cublaslt"


def parse_builds(text: str) -> dict:
    """``"base=;pf8=WG_PF=8,X=1"`` -> ``{"base": (), "pf8": (("WG_PF", "8"), ("X", "1"))}``."""
    builds = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        name, _, defs = item.partition("=")
        if not name or name in builds:
            raise ValueError(f"build names must be unique and non-empty: {item!r}")
        pairs = []
        for d in filter(None, defs.split(",")):
            k, eq, v = d.partition("=")
            if not eq or not k.removeprefix("@").isidentifier():
                raise ValueError(f"a define is NAME=VALUE (a host setting @NAME=VALUE), got {d!r} "
                                 f"in build {name!r}")
            pairs.append((k, v))
        builds[name] = tuple(pairs)
    if not builds:
        raise ValueError("no build given")
    return builds


def _file(name: str) -> str:
    return "gemm_wgmma_ab.cu" if name == "saved" else "gemm_wgmma.cu"


def instances(cases) -> list:
    """The gemm_wgmma instances the cases can launch (every tile width; both fused routes)."""
    import fp8lab.gpu.gemm as GM
    return sorted({GM._wg_instance(0, 0, _CASES[c], "bfloat16", bn=bn) for c in cases if c not in _FUSED
                   for bn in (128,) + GM._wide_widths(1)}
                  | {GM._fused_instance(0, 0, "bfloat16", q) for c in cases if c in _FUSED
                     for q in (1, 1 + GM._QA_ONCE)})


def device_defs(defs: tuple) -> tuple:
    """A build's ``#define`` pairs, without its host settings."""
    return tuple((k, v) for k, v in defs if not k.startswith("@"))


def _compile(job):
    from fp8lab.gpu import _loader
    name, defs, inst = job
    _loader.kernel(_file(name), inst, device_defs(defs))


def compile_all(jobs) -> None:
    """Compile ``(build name, defines, instance)`` jobs into the kernel cache, up to 16 at once, each
    process compiling one instance at a time (a compile takes 1-15 s)."""
    with cf.ProcessPoolExecutor(min(16, len(jobs)), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile, jobs))


def use(build: str, defs: tuple):
    """Route the library's gemm_wgmma launches to ``build`` (plans cleared)."""
    import fp8lab.gpu.gemm as GM
    global _KERNEL, _QA_NB
    if _KERNEL is None:   # the loader's own function and the tree's QA_NB, kept before the first rerouting
        _KERNEL, _QA_NB = GM._loader.kernel, GM._QA_NB
    GM._forget_plans()   # every plan cache: a plan holds the kernel of the build it was made under
    GM._QA_NB = int(dict(defs).get("QA_NB", _QA_NB))   # the host's mirror of the build's QA_NB
    host = {k[1:]: int(v) if v.isdigit() else v for k, v in defs if k.startswith("@")}
    for k in set(_HOST_SAVED) - set(host):   # settings of an earlier build back to the tree's
        setattr(GM, k, _HOST_SAVED.pop(k))
    for k, v in host.items():
        if not hasattr(GM, k):
            raise SystemExit(f"build {build!r}: fp8lab.gpu.gemm has no setting {k!r}")
        _HOST_SAVED.setdefault(k, getattr(GM, k))
        setattr(GM, k, v)
    defs = device_defs(defs)

    def kernel(f, i, *d):
        if f == "gemm_wgmma.cu" and i.startswith("gemm_wgmma<"):
            FETCHED[build] = FETCHED.get(build, 0) + 1
            return _KERNEL(_file(build), i, defs)
        return _KERNEL(f, i, *d)
    GM._loader.kernel = kernel


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", default="base=;saved=")
    ap.add_argument("--shapes", default="65536x1024x1024,8192x8192x8192")
    ap.add_argument("--cases", default="e4m3,blk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graph", action="store_true")
    a = ap.parse_args(argv)
    builds = parse_builds(a.builds)
    cases = a.cases.split(",")
    for c in cases:
        if c not in _CASES:
            raise SystemExit(f"unknown case {c!r}; known: {', '.join(_CASES)}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]

    import numpy as np
    import cupy as cp
    import torch

    import fp8lab.gpu.codecs as G
    import fp8lab.gpu.gemm as GM
    from gpu_gemm import _codes, _cublaslt, _make_scales, _timeit
    from gpu_fused import _graph_time, bf16_input, torch_cast_mm
    timeit = (lambda fn: _graph_time(cp, torch, fn, reps=10, n=10)) if a.graph else (lambda fn: _timeit(cp, fn))
    insts = instances(cases)
    jobs = [(n, d, i) for n, d in builds.items() for i in insts]
    compile_all(jobs)
    print(f"compiled {len(jobs)} instances ({len(builds)} builds)", flush=True)

    rows = []
    for (M, N, K) in shapes:
        fl = 2.0 * M * N * K
        grouped = "grouped" in cases
        x, y = _codes(cp, G, (M, K), "e4m3"), _codes(cp, G, (N, K), "e4m3")
        gx = _codes(cp, G, (_GROUP, M, K), "e4m3") if grouped else None
        gy = _codes(cp, G, (_GROUP, N, K), "e4m3") if grouped else None
        lt_fn = _cublaslt(torch, x, y)
        refs = {"cublaslt": lt_fn}
        if any(c in _FUSED for c in cases):   # bfloat16 A, a delayed (device) scale, its power of two
            xa, xa_cp, s, s2 = bf16_input(cp, torch, M, K)
            fscale = {"fused": cp.from_dlpack(s), "fused2": cp.from_dlpack(s2)}
            refs["cast+lt"] = torch_cast_mm(torch, xa, torch.from_dlpack(y).view(torch.float8_e4m3fn), s)
        t = {}
        same = {}
        for c in cases:
            if c in _FUSED:
                out = cp.empty((M, N), cp.uint16)
                fn = lambda: GM.gemm_fused(xa_cp, y, "e4m3", scale_a=fscale[c], out_dtype="bfloat16", out=out,
                                           bfloat16=True, check=False)
            elif c == "grouped":
                out = cp.empty((_GROUP, M, N), cp.uint16)
                fn = lambda: GM.gemm_grouped(gx, gy, "e4m3", out_dtype="bfloat16", out=out)
            else:
                sa, sb = _make_scales(cp, _CASES[c], M, N, K)
                out = cp.empty((M, N), cp.uint16)
                fn = lambda: GM.gemm(x, y, "e4m3", scale_a=sa, scale_b=sb, scaling=_CASES[c],
                                     out_dtype="bfloat16", out=out)
            ref = None
            for n, d in builds.items():
                use(n, d)
                before = FETCHED.get(n, 0)
                fn()
                if FETCHED.get(n, 0) == before:   # a cached plan ran another build's kernel
                    raise SystemExit(f"build {n!r}: the call took no kernel of this build")
                if ref is None:
                    ref = out.copy()
                same[(c, n)] = bool((out == ref).all())
            for _ in range(a.rounds):
                t.setdefault((c, _ref(c)), []).append(timeit(refs[_ref(c)]))
                for n, d in builds.items():
                    use(n, d)
                    t.setdefault((c, n), []).append(timeit(fn))
            kern = GM.last_kernel
        for c in cases:
            lt = fl / float(np.median(t[(c, _ref(c))])) / 1e12
            for n in builds:
                # grouped: 64 GEMMs per call, against 64 cuBLASLt calls (the same TFLOPS per GEMM)
                tf = fl * (_GROUP if c == "grouped" else 1) / float(np.median(t[(c, n)])) / 1e12
                rows.append((f"{M}x{N}x{K}", c, n, tf, lt, same[(c, n)]))
                print(f"{M:>6d}x{N:>5d}x{K:>5d} {c:5s} {n:10s} {tf:7.0f} TFLOPS  cuBLASLt {lt:7.0f}  "
                      f"ratio {tf / lt:.3f}  same bits as {next(iter(builds))}: {same[(c, n)]}", flush=True)
        print(f"  (kernel: {kern})", flush=True)
    print(f"{'shape':>18s} {'case':5s} {'build':10s} {'TFLOPS':>7s} {'cuBLASLt':>8s} {'ratio':>6s} same")
    for s, c, n, tf, lt, ok in rows:
        print(f"{s:>18s} {c:5s} {n:10s} {tf:7.0f} {lt:8.0f} {tf / lt:6.3f} {'yes' if ok else 'NO'}")
    return 0 if all(r[5] for r in rows) else 1


_KERNEL = _QA_NB = None
FETCHED: dict = {}   # build -> gemm_wgmma kernels fetched under it (each timed call must fetch)
_HOST_SAVED: dict = {}   # host setting -> the tree's value, while a build has it changed

if __name__ == "__main__":
    raise SystemExit(main())
