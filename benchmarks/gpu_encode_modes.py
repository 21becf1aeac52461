"""HiF8 float32 encode bandwidth through the public call and the table kernel, per rounding mode,
against torch's float32 -> float8_e4m3fn cast (H200; torch is a baseline only).

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_encode_modes.py

2^28 elements, bytes read + written (5 per element); medians of 20 (batched: 10 calls between
two events; single: one call), torch timed first and last. The figures of docs/gpu.md's
"dedicated run" of the hif8 default come from this script.
"""

from __future__ import annotations

import sys

import numpy as np


def main() -> int:
    import cupy as cp
    import torch

    import fp8lab.gpu.codecs as G
    from fp8lab.codecs import _lut
    from fp8lab.formats import get_format
    from gpu_codecs_v3 import timed

    n = 1 << 28
    x = cp.random.standard_normal(n, dtype=cp.float32)
    out = cp.empty(n, cp.uint8)
    f = get_format("hif8")
    cfg = G.ENCODE_LUT32
    tx = torch.from_dlpack(x)
    rows = [("torch", lambda: tx.to(torch.float8_e4m3fn))]
    for mode in ("nearest_even", "nearest_away", "toward_zero"):
        rows.append((f"lut32 {cfg} {mode}", lambda m=mode: G._encode_lut32(x, out, f, m, False, cfg)))
    rows.append(("G.encode(x, 'hif8')", lambda: G.encode(x, "hif8")))
    rows.append(("G.encode(x, 'hif8', nearest_even)", lambda: G.encode(x, "hif8", rounding="nearest_even")))
    rows.append(("torch", lambda: tx.to(torch.float8_e4m3fn)))
    for name, fn in rows:
        tb, ts = timed(cp, fn)
        print(f"{name:40s} {5 * n / tb / 1e9:7.0f} GB/s  single {5 * n / ts / 1e9:7.0f}")
    for mode in ("nearest_even", "nearest_away"):
        print(mode, "table: distinct codes", len(np.unique(_lut(f, "float32", mode, False))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
