"""Conformance sweep over all 2^32 float32 inputs.

``python -m fp8lab.conformance`` checks, chunk by chunk over every float32 bit pattern:

1. ``e4m3``, ``e5m2`` (and the FNUZ formats) with nearest-even, non-saturating: fp8lab's encoder
   against ``ml_dtypes`` ``astype`` (non-NaN inputs must agree bit for bit; NaN inputs must give
   the format's ``nan_encode`` code for their sign, and the NaN codes ml_dtypes writes are
   counted separately).
2. Every format, every deterministic rounding mode, saturate on and off: the float32 lookup-table
   path (what :func:`fp8lab.encode` runs) against the generic bit-level encoder.
3. Every format and every rounding mode (stochastic too): the Numba encoder against the
   definition (:func:`fp8lab.reference.encode_array_vectorized`) on a dense sample: a strided
   sweep plus every exact tie of the rounding grid and its float32 neighbours.

Exit status 0 when every count is 0. ``--chunks N`` limits part 1-2 to N chunks of 2^24 (spread
over the whole range) for a quick look; the default is all 256.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import _kernels as K
from .codecs import _encoder_params, _lut, _seed_key
from .formats import ROUNDING_MODES, get_format, list_formats
from .reference import encode_array_vectorized

DETERMINISTIC = [m for m in ROUNDING_MODES if m != "stochastic"]
_ML_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
             "e5m2fnuz": "float8_e5m2fnuz"}


def _generic(bits: np.ndarray, fmt, mode: str, sat: bool, out: np.ndarray, seed=0) -> np.ndarray:
    key = _seed_key(seed) if mode == "stochastic" else np.uint64(0)
    K.encode_bits_parallel(bits, out, np.int64(32), np.int64(24), np.int64(127),
                           np.int64(K.MODE_CODES[mode]), sat, *_encoder_params(fmt), key, np.int64(0))
    return out


def _dense_sample(fmt) -> np.ndarray:
    """Strided float32 patterns plus every tie of the format's grid and one ulp either side."""
    strided = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    g = [0.0] + [float(v) for v in fmt.positive_values] + [float(fmt.overflow_value)]
    ties = np.array([(a + b) / 2 for a, b in zip(g, g[1:])], np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf)),
                           np.array(g, np.float32)])
    both = np.concatenate([near, -near])
    return np.concatenate([strided, both])


def run(chunks: int = 256, formats=None, out=sys.stdout) -> int:
    formats = [get_format(f) for f in (formats or list_formats())]
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover
        ml_dtypes = None
        print("ml_dtypes not installed: part 1 skipped", file=out)
    n = 1 << 24
    picks = np.linspace(0, 255, chunks).round().astype(int) if chunks < 256 else np.arange(256)
    ml_bad = {f.name: 0 for f in formats if f.name in _ML_NAMES}
    ml_nan = {f.name: set() for f in formats if f.name in _ML_NAMES}
    nan_bad = {f.name: 0 for f in formats}
    lut_bad = {(f.name, m, s): 0 for f in formats for m in DETERMINISTIC for s in (False, True)}
    a = np.empty(n, np.uint8)
    b = np.empty(n, np.uint8)
    t0 = time.perf_counter()
    for k, c in enumerate(picks):
        bits = np.arange(int(c) * n, (int(c) + 1) * n, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        isnan = np.isnan(x)
        neg = np.signbit(x)
        for f in formats:
            for mode in DETERMINISTIC:
                for sat in (False, True):
                    K.lut32_parallel(bits, _lut(f, "float32", mode, sat), a)
                    _generic(bits, f, mode, sat, b)
                    lut_bad[(f.name, mode, sat)] += int(np.count_nonzero(a != b))
                    if mode == "nearest_even" and not sat:
                        want_nan = np.where(neg, f.nan_encode[1], f.nan_encode[0])
                        nan_bad[f.name] += int(np.count_nonzero((a != want_nan) & isnan))
                        if ml_dtypes is not None and f.name in _ML_NAMES:
                            ref = x.astype(getattr(ml_dtypes, _ML_NAMES[f.name])).view(np.uint8)
                            ml_bad[f.name] += int(np.count_nonzero((a != ref) & ~isnan))
                            ml_nan[f.name].update(np.unique(ref[isnan]).tolist())
        if (k + 1) % 16 == 0 or k + 1 == len(picks):
            print(f"  chunk {k + 1}/{len(picks)}  {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    ok = True
    print(f"# fp8lab conformance: {len(picks)} of 256 chunks of 2^24 float32 inputs "
          f"({len(picks) * n:,} inputs)", file=out)
    print("\n## 1. nearest_even, non-saturating, against ml_dtypes (non-NaN inputs)", file=out)
    print("| format | mismatches | NaN inputs not giving nan_encode | NaN codes ml_dtypes writes |", file=out)
    print("|---|---|---|---|", file=out)
    for name in ml_bad:
        ok &= ml_bad[name] == 0 and nan_bad[name] == 0
        print(f"| {name} | {ml_bad[name]} | {nan_bad[name]} | "
              f"{', '.join(f'{c:#04x}' for c in sorted(ml_nan[name]))} |", file=out)
    print("\n## 2. float32 lookup-table path against the generic encoder", file=out)
    print("| format | " + " | ".join(f"{m} sat={s}" for m in DETERMINISTIC for s in (False, True)) + " |", file=out)
    print("|---" * (1 + 2 * len(DETERMINISTIC)) + "|", file=out)
    for f in formats:
        row = [lut_bad[(f.name, m, s)] for m in DETERMINISTIC for s in (False, True)]
        ok &= not any(row)
        print(f"| {f.name} | " + " | ".join(map(str, row)) + " |", file=out)
    print("\n## 3. Numba encoder against the definition on a dense sample", file=out)
    print("| format | sample | " + " | ".join(f"{m} sat={s}" for m in ROUNDING_MODES for s in (False, True)) + " |", file=out)
    print("|---|---" + "|---" * (2 * len(ROUNDING_MODES)) + "|", file=out)
    for f in formats:
        x = _dense_sample(f)
        buf = np.empty(x.size, np.uint8)
        row = []
        for mode in ROUNDING_MODES:
            for sat in (False, True):
                got = _generic(x.view(np.uint32), f, mode, sat, buf, seed=77)
                ref = encode_array_vectorized(x, f, mode, sat, seed=77 if mode == "stochastic" else None)
                row.append(int(np.count_nonzero(got != ref)))
        ok &= not any(row)
        print(f"| {f.name} | {x.size:,} | " + " | ".join(map(str, row)) + " |", file=out)
    print(f"\n{'PASS' if ok else 'FAIL'} in {time.perf_counter() - t0:.0f} s", file=out)
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8lab.conformance", description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=256, help="chunks of 2^24 inputs to sweep (1..256)")
    p.add_argument("--formats", nargs="*", help="formats to check (default: all)")
    args = p.parse_args(argv)
    if not 1 <= args.chunks <= 256:
        p.error("--chunks must be in 1..256")
    return run(args.chunks, args.formats)


if __name__ == "__main__":
    sys.exit(main())
