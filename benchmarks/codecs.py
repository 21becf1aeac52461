"""Codec speed and memory against ml_dtypes, side by side in one run.

    python benchmarks/codecs.py [--n 33554432] [--repeat 7]

Prints one table: median seconds of fp8lab and of the reference (ml_dtypes ``astype``) on the
same array, their ratio and the target. HiF8 has no ml_dtypes counterpart: its encode is compared
with ml_dtypes' E4M3 encode, its decode with ml_dtypes' E4M3 decode. Then the peak memory that
encode allocates (tracemalloc: NumPy reports its allocations there; the kernels allocate nothing),
the import time of fp8lab and the time of the first call with a cold and with a warm Numba cache
(each in a fresh process).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np


def median_time(fn, repeat: int) -> float:
    fn()  # warm-up (compilation, caches)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def fresh_process(code: str, env: dict | None = None) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 25)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()

    import ml_dtypes
    import numba

    import fp8lab

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(args.n) * 8).astype(np.float32)
    ml = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    rows = []
    t_ml_enc = {k: median_time(lambda d=d: x.astype(d), args.repeat) for k, d in ml.items()}
    codes = {f: fp8lab.encode(x, f) for f in ("e4m3", "e5m2", "hif8")}
    ml_codes = {k: codes[k].view(d) for k, d in ml.items()}
    t_ml_dec = {k: median_time(lambda c=c: c.astype(np.float32), args.repeat) for k, c in ml_codes.items()}
    for f in ("e4m3", "e5m2", "hif8"):
        ref = f if f in ml else "e4m3"
        t = median_time(lambda f=f: fp8lab.encode(x, f), args.repeat)
        rows.append((f"encode f32->{f}", t, f"ml_dtypes f32->{ref}", t_ml_enc[ref], 4.0 if f in ml else 3.0))
    for f in ("e4m3", "e5m2", "hif8"):
        ref = f if f in ml else "e4m3"
        t = median_time(lambda f=f: fp8lab.decode(codes[f], f), args.repeat)
        rows.append((f"decode {f}->f32", t, f"ml_dtypes {ref}->f32", t_ml_dec[ref], 8.0))

    print(f"# fp8lab codecs vs ml_dtypes {ml_dtypes.__version__}: {args.n:,} float32 elements, "
          f"median of {args.repeat}, numba threads {numba.get_num_threads()}, {os.cpu_count()} cores\n")
    print("| operation | fp8lab s | Gelem/s | reference | reference s | speed-up | target | met |")
    print("|---|---|---|---|---|---|---|---|")
    for name, t, rname, rt, target in rows:
        print(f"| {name} | {t:.4f} | {args.n / t / 1e9:.2f} | {rname} | {rt:.4f} | "
              f"{rt / t:.1f}x | >= {target:.0f}x | {'yes' if rt / t >= target else 'NO'} |")

    tracemalloc.start()
    fp8lab.encode(x, "e4m3")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"\nencode peak allocation: {peak / 2**20:.2f} MiB for a {x.size / 2**20:.2f} MiB output "
          f"(extra {(peak - x.size) / 2**10:.1f} KiB)")

    imp = fresh_process("import time; t=time.perf_counter(); import fp8lab; print(time.perf_counter()-t)")
    first = ("import time, numpy as np, fp8lab; x=np.ones(1000, np.float32); t=time.perf_counter(); "
             "fp8lab.encode(x, 'e4m3'); fp8lab.decode(np.zeros(10, np.uint8), 'e4m3'); "
             "print(time.perf_counter()-t)")
    with tempfile.TemporaryDirectory() as cache:
        cold = fresh_process(first, {"NUMBA_CACHE_DIR": cache})
        warm = fresh_process(first, {"NUMBA_CACHE_DIR": cache})
    print(f"import fp8lab: {imp * 1e3:.0f} ms; first encode+decode call: cold cache {cold:.2f} s, "
          f"warm cache {warm:.2f} s")


if __name__ == "__main__":
    main()
