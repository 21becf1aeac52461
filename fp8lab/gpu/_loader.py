"""The one loader of fp8lab's CUDA sources.

Reads ``<data_dir("gpu")>/<file>``, expands ``#include "x.cuh"`` of sibling headers (each with a
``#line`` directive, so compiler errors name the real file and line), prepends the ``#define`` s
the caller derived from a format declaration, and compiles one template instance with NVRTC for
sm_90a under :data:`OPTIONS`. The cubin and the instance's mangled name are kept on disk
(:func:`cache_dir`) and loaded with ``cupy.RawModule(path=...)``; kernels are memoized per
(device, file, defines, template instance).

Why not ``cupy.RawModule(code=...)``: CuPy appends ``-ftz=true`` to the caller's NVRTC options,
after them (NVRTC takes the last), so every float32 add, multiply, fma, comparison and widening to
float64 would flush subnormal inputs and results to zero, where the CPU reference keeps them:
scaled outputs below 2^-126, subnormal bfloat16 or float32 input at a tiny scale. fp8lab therefore
drives NVRTC itself through CuPy's binding of it, with ``-ftz=false``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import struct
import tempfile
import threading
from pathlib import Path

from ..formats import data_dir

__all__ = ["source", "kernel", "format_defines", "cache_dir", "OPTIONS"]

#: NVRTC options of every kernel: sm_90a (wgmma), C++17, IEEE float32 (subnormals kept; the other
#: floating-point options are NVRTC's defaults: IEEE division and square root, fma contraction on),
#: and device functions by default, as CuPy compiles them.
OPTIONS = ("-arch=sm_90a", "-std=c++17", "-ftz=false", "--device-as-default-execution-space")
_CACHE_FORMAT = "fp8lab-cubin-1"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_LINE_PATH = re.compile(r'^#line (\d+) "(?:[^"]*/)?([^"/]*)"$', re.M)
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


def code(file: str, defines: tuple = ()) -> str:
    """The text NVRTC compiles for ``gpu/<file>``: ``defines`` as ``#define`` lines, then :func:`source`."""
    return "".join(f"#define {n} {v}\n" for n, v in defines) + source(file)


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
    path, lowered = compile_instance(code(file, defines), instance)
    k = cupy.RawModule(path=str(path)).get_function(lowered)
    with _lock:
        _modules[key] = k
    return k


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$FP8LAB_KERNEL_CACHE``, else ``fp8lab/`` inside CuPy's
    kernel cache (``$CUPY_CACHE_DIR``, else ``~/.cupy/kernel_cache``)."""
    own = os.environ.get("FP8LAB_KERNEL_CACHE")
    if own:
        return Path(own)
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache") / "fp8lab"


def compile_instance(code: str, instance: str) -> tuple[Path, str]:
    """The cubin of template ``instance`` of ``code`` under :data:`OPTIONS`, and its mangled name:
    from the cache when an entry for this code, instance, options and NVRTC version is there and
    intact, else compiled with NVRTC and stored. Needs CuPy (its NVRTC binding), not a GPU."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:
        import cupy
        raise ImportError(f"fp8lab compiles its kernels through CuPy's binding of NVRTC "
                          f"(cupy_backends.cuda.libs.nvrtc), which CuPy {cupy.__version__} does not "
                          f"have; install a CuPy of the 13 or 14 series") from exc

    # the key ignores where the sources lie (the #line paths): a cache built on one machine serves
    # another with the same sources
    ident = "\0".join((_CACHE_FORMAT, repr(OPTIONS), repr(nvrtc.getVersion()), instance,
                       _LINE_PATH.sub(r'#line \1 "\2"', code)))
    key = hashlib.sha256(ident.encode()).hexdigest()
    where = cache_dir()
    path, meta = where / f"{key}.cubin", where / f"{key}.name"
    if path.is_file() and meta.is_file():   # meta holds the name and the cubin's digest
        lowered, _, digest = meta.read_text().partition("\n")
        if digest == hashlib.sha256(path.read_bytes()).hexdigest():
            return path, lowered
    prog = nvrtc.createProgram(code, "fp8lab.cu", (), ())
    try:
        nvrtc.addNameExpression(prog, instance)
        try:
            nvrtc.compileProgram(prog, OPTIONS)
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC could not compile {instance}:\n{nvrtc.getProgramLog(prog)}") from exc
        cubin = whole_elf(nvrtc.getCUBIN(prog))
        lowered = nvrtc.getLoweredName(prog, instance)
    finally:
        nvrtc.destroyProgram(prog)
    where.mkdir(parents=True, exist_ok=True)
    _write(path, cubin)   # the cubin first: an entry counts once its name and digest are there
    _write(meta, f"{lowered}\n{hashlib.sha256(cubin).hexdigest()}".encode())
    return path, lowered


def whole_elf(data: bytes) -> bytes:
    """``data`` with zeros appended up to the end its 64-bit ELF header declares (the end of its
    program and section header tables). CuPy's binding of ``nvrtcGetCUBIN`` returns one byte less
    than NVRTC wrote, as it does for the NUL that ends a PTX string; in a cubin that byte is the
    high byte of the last header's 8-byte field, a zero. Loaded from memory, the byte after a
    Python ``bytes`` object is its own terminating zero; loaded from a file, it must be there."""
    if len(data) < 64 or data[:5] != b"\x7fELF\x02":
        return data
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    return data + b"\0" * (end - len(data)) if 0 < end - len(data) <= 8 else data


def _write(path: Path, data: bytes) -> None:
    """``data`` into ``path`` all at once (a temporary file renamed over it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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
    tail = "void* fp8lab_instances[] = {\n" + "".join(f"    (void*)&{i},\n" for i in insts) + "};\n"
    return code(file, format_defines(get_format(fmt))) + tail


if __name__ == "__main__":  # python -m fp8lab.gpu._loader FILE [FORMAT [PART]]  -> stdout
    import sys

    if len(sys.argv) not in (2, 3, 4) or sys.argv[1] not in _INSTANCE_LISTS:
        print(f"usage: python -m fp8lab.gpu._loader FILE [FORMAT [i/n]]; FILE one of "
              f"{', '.join(_INSTANCE_LISTS)}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(emit(*sys.argv[1:]))
