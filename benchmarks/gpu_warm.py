"""Compile the GPU kernels ahead of a run, in parallel processes, into CuPy's kernel cache.

    PYTHONPATH=. python3 benchmarks/gpu_warm.py [--jobs 16] [--only SUBSTRING ...]

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


def _compile(inst):
    from fp8lab.gpu import _loader
    t0 = time.perf_counter()
    _loader.kernel("gemm_wgmma.cu", inst)
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
    a = ap.parse_args(argv)
    from fp8lab.gpu.gemm import _wg_instances
    insts = _wg_instances()
    if a.only:
        insts = [i for i in insts if any(s in i for s in a.only)]
    insts.sort(key=_cost_rank)
    t0 = time.perf_counter()
    n = 0
    with cf.ProcessPoolExecutor(a.jobs, mp_context=mp.get_context("spawn")) as ex:
        for fut in cf.as_completed([ex.submit(_compile, i) for i in insts]):
            inst, dt = fut.result()
            n += 1
            print(f"{time.perf_counter() - t0:6.1f} s  {n:3d}/{len(insts)}  {inst}: {dt:.1f} s", flush=True)
    print(f"gpu_warm: {n} gemm_wgmma.cu instances compiled in {time.perf_counter() - t0:.0f} s with {a.jobs} processes")


if __name__ == "__main__":
    main()
