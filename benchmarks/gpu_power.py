"""SM clock and power while a GEMM runs back to back, fp8lab against cuBLASLt: tells a kernel that
is slow per clock from a card that clocks it down (power or thermal limits).

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_power.py 8192x8192x8192,65536x1024x1024 3

Per shape and library (fp8lab e4m3 NT per-tensor, bfloat16 out, the library's tile choice;
cuBLASLt ``torch._scaled_mm`` on the same codes) the GEMM runs back to back for the given seconds
while ``nvidia-smi`` samples the card every 100 ms. Printed: TFLOPS over the run (CUDA events
around it), the median SM clock and power draw of the samples after the first second, and the
clock-event reasons seen (``none`` when no limit held the clock).
"""
import statistics
import subprocess
import sys
import time

import cupy as cp
import torch

import fp8lab.gpu.codecs as G
import fp8lab.gpu.gemm as GM
from gpu_gemm import _codes, _cublaslt

# nvidia-smi's clock-event reason bits
REASONS = {0x4: "sw-power-cap", 0x8: "hw-slowdown", 0x20: "sw-thermal", 0x40: "hw-thermal",
           0x80: "hw-power-brake", 0x1: "idle"}


def query() -> str:
    """The fields to sample; older drivers name the reasons clocks_throttle_reasons."""
    r = subprocess.run(["nvidia-smi", "--query-gpu=clocks_event_reasons.active", "--format=csv,noheader"],
                       capture_output=True, text=True)
    return "clocks.sm,power.draw," + ("clocks_event_reasons.active" if r.returncode == 0
                                      else "clocks_throttle_reasons.active")


def parse(out: str):
    """nvidia-smi's csv lines -> clocks (MHz), power (W), the set of reason names seen."""
    clocks, watts, reasons = [], [], set()
    for line in out.strip().splitlines():
        p = [x.strip() for x in line.split(",")]
        try:
            clocks.append(float(p[0]))
            watts.append(float(p[1]))
        except (ValueError, IndexError):
            continue
        try:
            m = int(p[2], 16)
            reasons.add("+".join(v for k, v in REASONS.items() if m & k) or "none")
        except (ValueError, IndexError):
            reasons.add(p[2] if len(p) > 2 else "?")
    return clocks, watts, reasons


def run(fn, flops: float, seconds: float, fields: str):
    for _ in range(3):
        fn()
    cp.cuda.runtime.deviceSynchronize()
    mon = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn()
        n += 20
        e1.record()
        e1.synchronize()
    ms = cp.cuda.get_elapsed_time(e0, e1)
    mon.terminate()
    out, _ = mon.communicate()
    clocks, watts, reasons = parse(out)
    k = min(10, len(clocks) // 2)   # the first second: clocks still settling
    return (n * flops / (ms * 1e-3) / 1e12, statistics.median(clocks[k:] or [0]),
            statistics.median(watts[k:] or [0]), sorted(reasons))


def main(shapes: str, seconds: float):
    fields = query()
    for s in shapes.split(","):
        M, N, K = (int(v) for v in s.split("x"))
        x, y = _codes(cp, G, (M, K), "e4m3"), _codes(cp, G, (N, K), "e4m3")
        out = cp.empty((M, N), cp.uint16)
        for name, fn in (("fp8lab", lambda: GM.gemm(x, y, "e4m3", out_dtype="bfloat16", out=out)),
                         ("cuBLASLt", _cublaslt(torch, x, y))):
            tf, mhz, w, rs = run(fn, 2.0 * M * N * K, seconds, fields)
            print(f"{s:>18s} {name:9s} {tf:7.0f} TFLOPS {mhz:6.0f} MHz {w:5.0f} W  {' '.join(rs)}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: gpu_power.py MxNxK[,MxNxK...] SECONDS")
    main(sys.argv[1], float(sys.argv[2]))
