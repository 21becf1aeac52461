"""Compile the GPU kernels ahead of a run, in parallel processes, into the loader's kernel cache.

    PYTHONPATH=. python3 benchmarks/gpu_warm.py [--jobs 16] [--only SUBSTRING ...]
        [--compile-only] [--builds "base=;x=WG_X=1" --cases blk,e4m3]

``--compile-only``: NVRTC only, no GPU (CuPy with its NVRTC binding must be installed, e.g.
``pip install cupy-cuda13x nvidia-cuda-nvrtc==13.0.88`` on a machine without a GPU), so a cache
can be built here and carried to a device: the cache key ignores where the sources lie, and the
NVRTC version must match (13.0 on the device image). ``--builds`` / ``--cases``: the instances
``gpu_ab.py`` would compile for those builds and cases instead of the library's own list.
Pack a cache for a device call's carry with ``tar czf - -C .cupycache . | split -b 15m -
.cupycache.tgz.`` (``gpu_session.sh`` unpacks it first).

A fresh machine otherwise compiles each gemm_wgmma instance (1-15 s each, one at a time) on its
first launch inside the timed or checked code. Instances are handed out one at a time, the
quantize-on-load ones (7 template arguments, the slowest to compile) first, so a slow one never
waits behind a queue of others in one process. Each compiled instance prints a line with its
time, so a run cut off by a time limit still says what it finished (the cache keeps those).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import time


def _compile(job):
    from fp8lab.gpu import _loader
    inst, defs, compile_only = job
    t0 = time.perf_counter()
    if compile_only:
        _loader.compile_instance(_loader.code("gemm_wgmma.cu", defs), inst)
    else:
        _loader.kernel("gemm_wgmma.cu", inst, defs)
    return inst, time.perf_counter() - t0


def _cost_rank(inst: str) -> int:
    """Smaller first: quantize-on-load instances, then the other GEMMs, then the small kernels."""
    if "<" not in inst or not inst.startswith("gemm_wgmma"):
        return 2
    return 0 if inst.count(",") >= 6 else 1


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--only", nargs="*", default=None,
                    help="compile only the instances whose name contains one of these strings")
    ap.add_argument("--compile-only", action="store_true", help="NVRTC only, no GPU needed")
    ap.add_argument("--builds", default=None, help="gpu_ab.py builds (their #defines; host settings ignored)")
    ap.add_argument("--cases", default="blk,e4m3", help="with --builds: gpu_ab.py cases")
    a = ap.parse_args(argv)
    from fp8lab.gpu.gemm import _wg_instances
    if a.builds is None:
        jobs = [(i, (), a.compile_only) for i in _wg_instances()]
    else:
        import gpu_ab
        insts = gpu_ab.instances(a.cases.split(","))
        jobs = [(i, gpu_ab.device_defs(d), a.compile_only) for d in gpu_ab.parse_builds(a.builds).values()
                for i in insts]
    if a.only:
        jobs = [j for j in jobs if any(s in j[0] for s in a.only)]
    jobs = sorted(set(jobs), key=lambda j: (_cost_rank(j[0]), j))
    t0 = time.perf_counter()
    n = 0
    with cf.ProcessPoolExecutor(a.jobs, mp_context=mp.get_context("spawn")) as ex:
        for fut in cf.as_completed([ex.submit(_compile, j) for j in jobs]):
            inst, dt = fut.result()
            n += 1
            print(f"{time.perf_counter() - t0:6.1f} s  {n:3d}/{len(jobs)}  {inst}: {dt:.1f} s", flush=True)
    print(f"gpu_warm: {n} gemm_wgmma.cu instances compiled in {time.perf_counter() - t0:.0f} s with {a.jobs} processes")


if __name__ == "__main__":
    main()
