"""Compile the GPU kernels ahead of a run, in parallel processes, into CuPy's kernel cache.

    PYTHONPATH=. python3 benchmarks/gpu_warm.py [--jobs 16]

A fresh machine otherwise compiles each gemm_wgmma instance (a few seconds each, one at a time)
on its first launch inside the timed or checked code. Prints the count and the wall time.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import time


def _compile(insts):
    from fp8lab.gpu import _loader
    for i in insts:
        _loader.kernel("gemm_wgmma.cu", i)
    return len(insts)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=16)
    a = ap.parse_args(argv)
    from fp8lab.gpu.gemm import _wg_instances
    insts = _wg_instances()
    chunks = [insts[i::a.jobs] for i in range(a.jobs)]
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(a.jobs, mp_context=mp.get_context("spawn")) as ex:
        n = sum(ex.map(_compile, chunks))
    print(f"gpu_warm: {n} gemm_wgmma.cu instances compiled in {time.perf_counter() - t0:.0f} s with {a.jobs} processes")


if __name__ == "__main__":
    main()
