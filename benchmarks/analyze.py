"""Throughput of ``fp8lab analyze``: parameters per second for 3 formats x 3 scaling recipes.

Writes a synthetic checkpoint (.safetensors: float32 and bfloat16 weights of transformer-like
shapes, Gaussian with a few outlier channels), then runs the same code path as the command
line, ``fp8lab.cli.main(["analyze", ...])``, after one warm-up run (so Numba's compile or cache
load is not timed). Prints one row per thread count.

    python benchmarks/analyze.py [--params 16e6] [--jobs 1,2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import tempfile
import time

import numpy as np


def make_checkpoint(path: str, n_params: float, seed: int = 0) -> int:
    from fp8lab._io import write_safetensors

    rng = np.random.default_rng(seed)
    tensors, total, i = {}, 0, 0
    while total < n_params:
        rows, cols = [(1024, 1024), (1024, 4096), (4096, 1024)][i % 3]
        w = (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)
        w[:, rng.integers(0, cols, 4)] *= 30.0
        if i % 2:  # every other tensor stored as bfloat16 (top 16 bits, truncated)
            tensors[f"layer{i}.weight"] = ("BF16", (w.view(np.uint32) >> 16).astype(np.uint16))
        else:
            tensors[f"layer{i}.weight"] = w
        total += w.size
        i += 1
    write_safetensors(path, tensors)
    return total


def run(path: str, jobs: int) -> float:
    from fp8lab.cli import main

    argv = ["analyze", path, "--formats", "e4m3,e5m2,hif8", "--scaling", "tensor,channel,block",
            "--quiet", "--jobs", str(jobs)]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"analyze failed with exit status {rc}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=16e6)
    ap.add_argument("--jobs", default=f"1,{os.cpu_count() or 1}")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        warm = os.path.join(tmp, "warm.safetensors")
        make_checkpoint(warm, 2e6, seed=1)
        path = os.path.join(tmp, "ckpt.safetensors")
        n = make_checkpoint(path, args.params)
        run(warm, 1)
        print(f"fp8lab analyze: {n / 1e6:.1f} M parameters, 3 formats x 3 recipes "
              f"(tensor, channel, block); {os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}")
        print(f"{'jobs':>4}  {'seconds':>8}  {'params/s':>10}  {'(param, format, recipe)/s':>26}")
        for jobs in sorted({int(j) for j in args.jobs.split(",")}):
            dt = min(run(path, jobs) for _ in range(2))
            print(f"{jobs:>4}  {dt:8.2f}  {n / dt / 1e6:8.2f} M  {9 * n / dt / 1e6:24.1f} M")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
