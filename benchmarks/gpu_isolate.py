"""One build of gpu/gemm_wgmma.cu checked case by case on wide tiles, each case synchronized, so
that a kernel fault names the case that raised it (a fault ends the process's CUDA context: run
one build per process).

    PYTHONPATH=.:benchmarks python3 benchmarks/gpu_isolate.py "base=" [--scaling SCALING] [--no-compile]

The build is ``name=DEFINES`` as in ``gpu_ab.py``. Cases: e4m3 x e4m3, both layouts, every
scaling and output type, on 192- and 256-wide tiles (``WIDE_TILES = "always"``) at the wide-tile
test's ragged shapes (``gpu_gemm.WIDE_SHAPES``), through ``gpu_gemm.check``, which checks each
against its float64 bound and synchronizes; ``--scaling`` keeps one scaling's cases and
``--no-compile`` skips the parallel compile of the build's instances (already in the kernel
cache): a shorter run under compute-sanitizer. Prints each case before it runs, then the
failures; exit status 0 when every case is within its bound, 1 when one is not, 3 on a fault.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--scaling", default=None)
    ap.add_argument("--no-compile", action="store_true", help="no parallel compile first (kernels cached)")
    a = ap.parse_args(argv)
    import gpu_ab
    import gpu_gemm
    import fp8lab.gpu.gemm as GM
    (name, defs), = gpu_ab.parse_builds(a.build).items()
    scalings = GM.SCALINGS if a.scaling is None else (a.scaling,)
    insts = sorted({GM._wg_instance(0, 0, s, o, bn=bn) for s in scalings for o in GM.OUT_DTYPES
                    for bn in (128,) + GM._wide_widths(1)}
                   | {GM._wg_instance(0, 0, s, o, v) for s in scalings for o in GM.OUT_DTYPES
                      for v in (False, True)})
    if not a.no_compile:
        gpu_ab.compile_all([(name, defs, i) for i in insts])
        print(f"build {name}: compiled {len(insts)} instances", flush=True)
    gpu_ab.use(name, defs)
    GM.WIDE_TILES = "always"
    bad = 0
    for w in GM._wide_widths(1):
        GM.WIDE_FP8 = w
        each = lambda case: print(f"wide {w} {case}", flush=True)
        try:
            bad += gpu_gemm.check(print, shapes=gpu_gemm.WIDE_SHAPES, pairs=(("e4m3", "e4m3"),),
                                  scalings=scalings, each=each)
        except Exception as e:   # a kernel fault (the last case printed): the context is gone
            print(f"FAULT {type(e).__name__}: {e}", flush=True)
            return 3
    print(f"build {name}: {bad} failing cases", flush=True)
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
