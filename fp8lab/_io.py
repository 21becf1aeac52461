"""Tensor file readers for the command line: .npy, .npz and .safetensors, one tensor at a time.

Checkpoints can be larger than memory, so nothing here reads a whole file. :func:`scan` walks the
paths it is given and yields, in order, one event per tensor or problem:

* :class:`TensorRef`: a tensor that can be analysed; ``ref.load()`` returns it as a float array
  (float32 files are memory-mapped, not copied; float16 and bfloat16 are widened to float32
  exactly, which costs one float32 copy of that tensor only).
* :class:`Problem` with ``level="error"``: something that could not be read (missing file, corrupt
  header, pickled objects, ...). The message is one line and names the file (and tensor).
* :class:`Problem` with ``level="note"``: something skipped on purpose (integer tensors, empty
  tensors).

A .safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (tensor
name -> ``{"dtype", "shape", "data_offsets": [begin, end]}``, offsets relative to the end of the
header, plus an optional ``"__metadata__"`` string map), then the raw little-endian data::

    | u64 N | JSON header (N bytes) | data ............................... |
                                    ^ offset 0 of every data_offsets pair

It is parsed here, without the ``safetensors`` package, and every header field is validated
before any data is touched. .npy and .npz go through :func:`numpy.load` with
``allow_pickle=False``: object arrays are refused, never unpickled.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import struct
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

__all__ = ["TensorRef", "Problem", "InputError", "scan", "read_safetensors_header",
           "write_safetensors", "SUFFIXES"]

#: File types the readers understand.
SUFFIXES = (".npy", ".npz", ".safetensors")

# safetensors dtype -> (numpy dtype of the stored bits, itemsize). Only these are analysed.
_ST_FLOAT = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8)}
# dtypes that are valid safetensors but not analysed: skipped with a note.
_ST_OTHER = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8,
             "I64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1, "F6_E2M3": 1,
             "F6_E3M2": 1, "C64": 8}
# The safetensors format itself caps its header at 100 MB; a larger length means corruption.
_ST_MAX_HEADER = 100 * 1024 * 1024
_ANALYSED = "float32, float16, bfloat16 and float64"


class InputError(Exception):
    """A file or tensor that cannot be read; ``str(exc)`` is one line naming it."""


@dataclasses.dataclass
class TensorRef:
    """One analysable tensor, not yet read.

    ``file`` is the path as given (or found in a directory), ``name`` the tensor's key inside it
    (the file name for .npy), ``dtype`` its stored type as a NumPy name (``bfloat16`` for BF16).
    """

    file: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    _load: Callable[[], np.ndarray] = dataclasses.field(repr=False)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def load(self) -> np.ndarray:
        """The tensor as float32 (float64 stays float64); raises :class:`InputError`."""
        try:
            arr = self._load()
        except InputError:
            raise
        except (OSError, ValueError) as exc:
            raise InputError(f"{self.file}: {self.name}: cannot read: {_one_line(exc)}") from exc
        return _widen(arr, self.dtype)


@dataclasses.dataclass(frozen=True)
class Problem:
    """A file or tensor that was not analysed: ``level`` is "error" or "note"."""

    level: str
    message: str
    exc: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _widen(arr: np.ndarray, dtype: str) -> np.ndarray:
    """float16 / bfloat16 bits -> float32 exactly; float32 and float64 pass through (no copy)."""
    if dtype == "bfloat16":
        # bfloat16 is the top half of a float32: shifting the bits up is exact.
        bits = np.asarray(arr).view(np.uint16) if arr.dtype.itemsize == 2 else arr
        out = np.empty(bits.shape, np.uint32)
        np.left_shift(bits, 16, out=out, dtype=np.uint32)
        return out.view(np.float32)
    if dtype == "float16":
        return np.asarray(arr, dtype=np.float32)
    arr = np.asarray(arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.aligned:  # the kernels want aligned data; copy this one tensor only
        arr = arr.copy()
    return arr


def _numpy_dtype_name(dt: np.dtype) -> str | None:
    """The analysed name of a NumPy dtype, or None when it is not analysed."""
    if dt.kind == "f" and dt.itemsize in (2, 4, 8):
        return {2: "float16", 4: "float32", 8: "float64"}[dt.itemsize]
    if dt.name == "bfloat16" or str(dt) == "bfloat16":
        return "bfloat16"
    return None


def _check_array(where: str, dt: np.dtype, shape: tuple) -> Problem | None:
    """A Problem when an array (named ``where`` in messages) is not analysed, else None."""
    if dt.hasobject:
        return Problem("error", f"{where}: refused: holds pickled Python objects "
                                "(fp8lab never unpickles)")
    if _numpy_dtype_name(dt) is None:
        return Problem("note", f"{where}: skipped: dtype {dt.name} is not a float type "
                               f"(analysed: {_ANALYSED})")
    if math.prod(shape) == 0:
        return Problem("note", f"{where}: skipped: empty tensor (shape {tuple(shape)})")
    return None


# ------------------------------------------------------------------------------------- .npy
def _scan_npy(path: Path, file: str) -> Iterator[TensorRef | Problem]:
    # Read only the header first: an object array is refused before NumPy sees its data.
    try:
        with open(path, "rb") as fh:
            dt, shape = _npy_header(fh)
    except (ValueError, OSError, EOFError) as exc:
        yield Problem("error", f"{file}: not a valid .npy file: {_one_line(exc)}", exc)
        return
    name = path.name
    problem = _check_array(file, dt, shape)
    if problem:
        yield problem
        return
    yield TensorRef(file, name, _numpy_dtype_name(dt), shape,
                    functools.partial(np.load, path, mmap_mode="r", allow_pickle=False))


def _npy_header(fh):
    """(dtype, shape) from an open .npy stream, without reading the data."""
    from numpy.lib import format as npformat

    version = npformat.read_magic(fh)
    if version == (1, 0):
        shape, _, dtype = npformat.read_array_header_1_0(fh)
    elif version in ((2, 0), (3, 0)):
        shape, _, dtype = npformat.read_array_header_2_0(fh)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    return dtype, tuple(shape)


# ------------------------------------------------------------------------------------- .npz
def _npz_member_header(zf: zipfile.ZipFile, member: str):
    """(dtype, shape) of a .npz member from its .npy header, without reading its data."""
    with zf.open(member) as fh:
        return _npy_header(fh)


def _scan_npz(path: Path, file: str) -> Iterator[TensorRef | Problem]:
    try:
        zf = zipfile.ZipFile(path)
        members = [m for m in zf.namelist() if m.endswith(".npy")]
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        yield Problem("error", f"{file}: not a valid .npz file: {_one_line(exc)}", exc)
        return
    with zf:
        if not members:
            yield Problem("error", f"{file}: holds no arrays")
            return
        for member in members:
            name = member[:-4]
            try:
                dt, shape = _npz_member_header(zf, member)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                yield Problem("error", f"{file}: {name}: not a valid array: {_one_line(exc)}",
                              exc)
                continue
            problem = _check_array(f"{file}: {name}", dt, shape)
            if problem:
                yield problem
                continue
            yield TensorRef(file, name, _numpy_dtype_name(dt), shape,
                            functools.partial(_load_npz_member, path, name))


def _load_npz_member(path: Path, name: str) -> np.ndarray:
    # np.load on an .npz reads only the member asked for; mmap_mode does not apply inside a zip.
    with np.load(path, allow_pickle=False, mmap_mode="r") as npz:
        return npz[name]


# ----------------------------------------------------------------------------- .safetensors
def read_safetensors_header(path: "str | os.PathLike") -> tuple[dict, int, int]:
    """Read and validate a .safetensors header without touching the data.

    Returns ``(entries, data_start, data_size)``: ``entries`` maps tensor name to its header
    dict, in the order of the data offsets. Raises :class:`InputError` with a one-line reason for
    anything malformed (bad header length, header beyond the end of the file, invalid JSON, a
    missing or ill-typed field, offsets out of range or not matching dtype and shape). Unknown
    dtypes are not rejected here; :func:`scan` reports them per tensor.
    """
    file = os.fspath(path)
    size = os.path.getsize(path)
    if size < 8:
        raise InputError(f"{file}: truncated safetensors file: {size} bytes, shorter than the "
                         "8-byte header length")
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n < 2 or n > _ST_MAX_HEADER:
            raise InputError(f"{file}: corrupt safetensors file: implausible header length {n}")
        if 8 + n > size:
            raise InputError(f"{file}: corrupt safetensors file: header length {n} exceeds the "
                             f"file size ({size} bytes)")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{file}: corrupt safetensors file: header is not valid JSON "
                         f"({_one_line(exc)})") from None
    if not isinstance(header, dict):
        raise InputError(f"{file}: corrupt safetensors file: header is not a JSON object")
    data_start = 8 + n
    data_size = size - data_start
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict)
                                 and all(isinstance(v, str) for v in meta.values())):
        raise InputError(f"{file}: corrupt safetensors file: __metadata__ must map strings "
                         "to strings")
    entries = {}
    for name, info in header.items():
        where = f"{file}: corrupt safetensors file: tensor {name!r}"
        if not isinstance(info, dict):
            raise InputError(f"{where}: entry is not an object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in info:
                raise InputError(f"{where}: missing {key!r}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str):
            raise InputError(f"{where}: dtype must be a string, not {dtype!r}")
        if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
            raise InputError(f"{where}: shape must be a list of non-negative integers, "
                             f"not {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_count(o) for o in offsets)):
            raise InputError(f"{where}: data_offsets must be two non-negative integers, "
                             f"not {offsets!r}")
        begin, end = offsets
        if begin > end or end > data_size:
            raise InputError(f"{where}: data_offsets [{begin}, {end}] out of range (data "
                             f"region is {data_size} bytes)")
        itemsize = (_ST_FLOAT.get(dtype) or (None, _ST_OTHER.get(dtype)))[1]
        if itemsize is not None and dtype not in ("F4", "F6_E2M3", "F6_E3M2"):
            want = math.prod(shape) * itemsize
            if end - begin != want:
                raise InputError(f"{where}: data_offsets span {end - begin} bytes but dtype "
                                 f"{dtype} and shape {shape} need {want}")
        entries[name] = info
    return (dict(sorted(entries.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))),
            data_start, data_size)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _scan_safetensors(path: Path, file: str) -> Iterator[TensorRef | Problem]:
    try:
        entries, data_start, _ = read_safetensors_header(path)
    except InputError as exc:
        yield Problem("error", str(exc), exc)
        return
    except OSError as exc:
        yield Problem("error", f"{file}: cannot read: {_one_line(exc)}", exc)
        return
    if not entries:
        yield Problem("error", f"{file}: holds no tensors")
        return
    for name, info in entries.items():
        dtype, shape = info["dtype"], tuple(info["shape"])
        if dtype in _ST_OTHER:
            yield Problem("note", f"{file}: {name}: skipped: dtype {dtype} is not analysed "
                                  f"(analysed: {_ANALYSED})")
            continue
        if dtype not in _ST_FLOAT:
            yield Problem("error", f"{file}: {name}: unknown safetensors dtype {dtype!r} "
                                   f"(known: {', '.join([*_ST_FLOAT, *_ST_OTHER])})")
            continue
        if math.prod(shape) == 0:
            yield Problem("note", f"{file}: {name}: skipped: empty tensor (shape {shape})")
            continue
        begin, end = info["data_offsets"]
        npdt = _ST_FLOAT[dtype][0]
        yield TensorRef(file, name, {"F32": "float32", "F16": "float16", "BF16": "bfloat16",
                                     "F64": "float64"}[dtype], shape,
                        functools.partial(_map_safetensor, path, data_start + begin,
                                          end - begin, npdt, shape))


def _map_safetensor(path: Path, offset: int, nbytes: int, npdt: str, shape: tuple) -> np.ndarray:
    # Map only this tensor's bytes; the mapping goes when the array is dropped.
    count = nbytes // np.dtype(npdt).itemsize
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(nbytes,))
    return mm.view(npdt)[:count].reshape(shape)


# ------------------------------------------------------------------------------------ walking
_SCANNERS = {".npy": _scan_npy, ".npz": _scan_npz, ".safetensors": _scan_safetensors}


def scan(paths) -> Iterator[TensorRef | Problem]:
    """Yield a :class:`TensorRef` or :class:`Problem` for every tensor under ``paths``.

    A directory stands for the .npy, .npz and .safetensors files directly inside it (sorted by
    name). Nothing is read until ``TensorRef.load`` is called, except headers.
    """
    for p in paths:
        path = Path(p)
        file = os.fspath(p)
        if path.is_dir():
            files = sorted(f for f in path.iterdir() if f.suffix in SUFFIXES and f.is_file())
            if not files:
                yield Problem("error", f"{file}: directory holds no .npy, .npz or .safetensors "
                                       "files")
            for f in files:
                yield from _scan_file(f, os.fspath(f))
        elif not path.exists():
            yield Problem("error", f"{file}: no such file or directory")
        else:
            yield from _scan_file(path, file)


def _scan_file(path: Path, file: str) -> Iterator[TensorRef | Problem]:
    scanner = _SCANNERS.get(path.suffix.lower())
    if scanner is None:
        yield Problem("error", f"{file}: unknown file type {path.suffix or '(no suffix)'!r}; "
                               "known: .npy, .npz, .safetensors")
        return
    yield from scanner(path, file)


# ------------------------------------------------------------------------------------ writing
def write_safetensors(path: "str | os.PathLike", tensors: dict, metadata: dict | None = None):
    """Write ``tensors`` (name -> float32 / float16 / float64 / integer array) as .safetensors.

    A small writer for test fixtures and the benchmark; ``{"name": ("BF16", uint16_bits)}``
    stores raw bfloat16 bits. The header is padded with spaces to a multiple of 8 bytes so that
    every tensor's data is aligned, as the reference implementation does.
    """
    codes = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<f8"): "F64",
             np.dtype("<i8"): "I64", np.dtype("<i4"): "I32", np.dtype("uint8"): "U8",
             np.dtype("int8"): "I8", np.dtype("bool"): "BOOL"}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, value in tensors.items():
        if isinstance(value, tuple):
            dtype, arr = value
            arr = np.ascontiguousarray(arr)
        else:
            arr = np.ascontiguousarray(value)
            dtype = codes[arr.dtype.newbyteorder("<")]
        data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw)) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for b in blobs:
            fh.write(b)
