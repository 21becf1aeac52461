"""The one loader of fp8lab's CUDA sources.

Reads ``<data_dir("gpu")>/<file>``, expands ``#include "x.cuh"`` of sibling headers (each with a
``#line`` directive, so compiler errors name the real file and line), prepends the ``#define`` s
the caller derived from a format declaration, and compiles with NVRTC for sm_90a through
``cupy.RawModule``. Modules are memoized per (device, file, defines, template instance).
"""

from __future__ import annotations

import functools
import re
import threading

from ..formats import data_dir

__all__ = ["source", "kernel", "format_defines", "OPTIONS"]

OPTIONS = ("-arch=sm_90a", "-std=c++17")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_lock = threading.Lock()
_modules: dict = {}


def source(name: str) -> str:
    """Text of ``gpu/<name>`` with local includes expanded and ``#line`` directives added."""
    return _expand(name, ())


def _expand(name: str, stack: tuple) -> str:
    if name in stack:
        raise RuntimeError(f"include cycle: {' -> '.join(stack + (name,))}")
    path = data_dir("gpu") / name
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in data_dir("gpu").glob("*.cu*")))
        raise FileNotFoundError(f"no CUDA source {name!r} in {data_dir('gpu')}; known: {known}")
    real = path.resolve().as_posix()
    out = [f'#line 1 "{real}"']
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        m = _INCLUDE.match(line)
        if m and (data_dir("gpu") / m.group(1)).is_file():
            out.append(_expand(m.group(1), stack + (name,)))
            out.append(f'#line {lineno + 1} "{real}"')
        elif line.strip() == "#pragma once":
            out.append("")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def kernel(file: str, instance: str, defines: tuple = ()):
    """The compiled ``cupy.RawKernel`` for template ``instance`` of ``gpu/<file>``.

    ``defines``: a tuple of ``(name, value)`` pairs (hashable), typically :func:`format_defines`.
    """
    import cupy

    dev = cupy.cuda.Device().id
    key = (dev, file, defines, instance)
    with _lock:
        k = _modules.get(key)
    if k is not None:
        return k
    head = "".join(f"#define {n} {v}\n" for n, v in defines)
    code = head + source(file)
    mod = cupy.RawModule(code=code, options=OPTIONS, name_expressions=(instance,))
    k = mod.get_function(instance)
    with _lock:
        _modules[key] = k
    return k


@functools.lru_cache(maxsize=None)
def format_defines(fmt) -> tuple:
    """``#define`` pairs of format ``fmt``'s encoder constants (from its declaration)."""
    from .. import _kernels as K
    from ..codecs import _encoder_params

    e_low, e_max, top_count, mbits, base, codes = _encoder_params(fmt)
    names = ("MAX", "ZERO_POS", "ZERO_NEG", "NAN_POS", "NAN_NEG", "OVF_POS", "OVF_NEG")
    d = [("FMT_E_LOW", int(e_low)), ("FMT_E_MAX", int(e_max)), ("FMT_TOP_COUNT", int(top_count)),
         ("FMT_NBIN", len(mbits)),
         ("FMT_MBITS", "{" + ",".join(str(int(v)) for v in mbits) + "}"),
         ("FMT_BASE", "{" + ",".join(str(int(v)) for v in base) + "}")]
    for n in names:
        d.append((f"FMT_CODE_{n}", int(codes[getattr(K, f"C_{n}")])))
    for mode, v in K.MODE_CODES.items():
        d.append((f"MODE_{mode.upper()}", int(v)))
    return tuple(d)


# Which module lists the template instances of each source (for the offline nvcc build check).
_INSTANCE_LISTS = {
    "codecs.cu": "fp8lab.gpu.codecs",
    "codec_check.cu": "fp8lab.gpu.check",
    "gemm.cu": "fp8lab.gpu.gemm",
    "gemm_wgmma.cu": ("fp8lab.gpu.gemm", "_wg_instances"),
    "quantize.cu": "fp8lab.gpu.quantize",
}


def emit(file: str, fmt: str = "e4m3", part: str = "0/1") -> str:
    """A stand-alone translation unit of ``gpu/<file>`` for nvcc: the defines of ``fmt``, the
    source, and every template instance the library uses (their addresses taken, which makes
    nvcc compile them exactly as NVRTC does at run time). ``part`` "i/n": only instances i, i + n,
    ... (n units that together hold every instance, to compile in parallel)."""
    import importlib

    from ..formats import get_format

    entry = _INSTANCE_LISTS[file]
    modname, fn = entry if isinstance(entry, tuple) else (entry, "_instances")
    i, n = (int(v) for v in part.split("/"))
    if not 0 <= i < n:
        raise ValueError(f"part must be i/n with 0 <= i < n, got {part!r}")
    insts = getattr(importlib.import_module(modname), fn)()[i::n]
    head = "".join(f"#define {n} {v}\n" for n, v in format_defines(get_format(fmt)))
    tail = "void* fp8lab_instances[] = {\n" + "".join(f"    (void*)&{i},\n" for i in insts) + "};\n"
    return head + source(file) + tail


if __name__ == "__main__":  # python -m fp8lab.gpu._loader FILE [FORMAT [PART]]  -> stdout
    import sys

    if len(sys.argv) not in (2, 3, 4) or sys.argv[1] not in _INSTANCE_LISTS:
        print(f"usage: python -m fp8lab.gpu._loader FILE [FORMAT [i/n]]; FILE one of "
              f"{', '.join(_INSTANCE_LISTS)}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(emit(*sys.argv[1:]))
