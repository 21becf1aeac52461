"""Format declarations and everything derived from them.

Each 8-bit format is declared once, as data, in a TOML file of the ``formats/`` folder (inside the
wheel: ``fp8lab/_formats``). This module reads a declaration, decodes all 256 codes exactly from it
(the definitional decoder), and derives from those 256 values every fact the rest of fp8lab uses:
limits, special codes, the finfo record, and the per-binade tables that drive the fast encoders.
Nothing here is typed a second time per format.

>>> import fp8lab
>>> f = fp8lab.get_format("e4m3")
>>> f.finfo.max, f.finfo.smallest_subnormal, f.finfo.eps
(448.0, 0.001953125, 0.125)
>>> fp8lab.get_format("hifloat8").name
'hif8'
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

__all__ = [
    "Format",
    "FormatInfo",
    "get_format",
    "list_formats",
    "finfo",
    "ROUNDING_MODES",
    "data_dir",
]

#: Rounding modes every format accepts. ``None`` as a call argument means the format's default.
ROUNDING_MODES = ("nearest_even", "nearest_away", "toward_zero", "stochastic")

_NAN = float("nan")


def data_dir(kind: str = "formats") -> Path:
    """Folder holding the package data ``kind`` ("formats" or "gpu").

    In an installed wheel these are the subpackages ``fp8lab._formats`` / ``fp8lab._gpu``; in a
    source checkout (the package imported from the repository) they are the top-level folders.
    """
    if kind not in ("formats", "gpu"):
        raise ValueError(f"unknown data folder {kind!r}; known: formats, gpu")
    here = Path(__file__).resolve().parent
    installed = here / f"_{kind}"
    if installed.is_dir():
        return installed
    checkout = here.parent / kind
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"fp8lab data folder {kind!r} not found beside {here}")


@dataclasses.dataclass(frozen=True)
class FormatInfo:
    """A finfo-like record, derived from a format's declaration.

    Attributes
    ----------
    max : float
        Largest finite value.
    smallest_normal : float
        Smallest positive normal value (for HiF8: the smallest value outside the denormal
        extension, 2^-15).
    smallest_subnormal : float
        Smallest positive value.
    eps : float
        Distance from 1.0 to the next larger value.
    max_code, nan_codes, inf_codes, zero_codes : codes of these values.
    n_finite : int
        Number of distinct finite values (+0 and -0 count once).
    scale_target : float
        The largest value that still has the format's full mantissa width: the value a
        max-scaling recipe maps a tensor's amax to. It is ``max`` for E4M3, E5M2 and the FNUZ
        formats; for HiF8 it is 15 (1.875 * 2^3), the top of the 3-mantissa-bit region, since
        mapping amax to 32768 would leave the largest values with a single mantissa bit
        (about 12 dB less SQNR on Gaussian data).
    """

    name: str
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    max_code: int
    nan_codes: tuple[int, ...]
    inf_codes: tuple[int, ...]
    zero_codes: tuple[int, ...]
    n_finite: int
    has_negative_zero: bool
    has_inf: bool
    scale_target: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, eq=False)
class Format:
    """One 8-bit floating-point format, built from its declaration.

    Do not construct directly: use :func:`get_format`. The decoded value of every code is exact
    (a :class:`fractions.Fraction`, or a float for NaN and the infinities).

    Attributes
    ----------
    name, aliases, description, source, kind, default_rounding
        From the declaration.
    values : tuple
        ``values[c]`` is the exact value of code ``c``: a Fraction, ``-0.0`` for negative zero,
        ``nan`` or ``+-inf``.
    classes : tuple of str
        ``"zero"``, ``"subnormal"``, ``"normal"``, ``"inf"`` or ``"nan"`` per code.
    fields : tuple of str
        Each code's bits split by field, e.g. ``"0|0111|000"`` (E4M3) or ``"0|11|0111|0"`` (HiF8).
    """

    name: str
    aliases: tuple[str, ...]
    description: str
    source: str
    kind: str
    default_rounding: str
    values: tuple
    classes: tuple[str, ...]
    fields: tuple[str, ...]
    pattern_values: tuple  # value each positive code's bits would have if no code were special
    nan_encode: tuple[int, int]
    declaration: Mapping = dataclasses.field(repr=False, compare=False, hash=False)

    # ----------------------------------------------------------------- derived facts
    @functools.cached_property
    def nan_codes(self) -> tuple[int, ...]:
        return tuple(c for c in range(256) if self.classes[c] == "nan")

    @functools.cached_property
    def inf_codes(self) -> tuple[int, int] | tuple[()]:
        """(+Inf code, -Inf code), or () when the format has no infinities."""
        pos = [c for c in range(256) if self.classes[c] == "inf" and self.values[c] > 0]
        neg = [c for c in range(256) if self.classes[c] == "inf" and self.values[c] < 0]
        return (pos[0], neg[0]) if pos else ()

    @functools.cached_property
    def zero_codes(self) -> tuple[int, ...]:
        return tuple(c for c in range(256) if self.classes[c] == "zero")

    @functools.cached_property
    def has_negative_zero(self) -> bool:
        return len(self.zero_codes) == 2

    @functools.cached_property
    def positive_values(self) -> tuple[Fraction, ...]:
        """Sorted positive finite values."""
        return tuple(sorted(v for c, v in enumerate(self.values)
                            if self.classes[c] in ("normal", "subnormal") and v > 0))

    @functools.cached_property
    def code_of(self) -> Mapping[Fraction, int]:
        """Exact finite value -> code (+0 -> the positive zero code)."""
        out = {}
        for c in range(256):
            if self.classes[c] in ("normal", "subnormal", "zero"):
                v = Fraction(self.values[c]) if not isinstance(self.values[c], Fraction) else self.values[c]
                if v not in out or c < out[v]:
                    out[v] = c
        return MappingProxyType(out)

    @functools.cached_property
    def max_value(self) -> Fraction:
        return self.positive_values[-1]

    @functools.cached_property
    def max_code(self) -> int:
        return self.code_of[self.max_value]

    @functools.cached_property
    def binades(self) -> "BinadeTable":
        return _binade_table(self)

    @functools.cached_property
    def overflow_value(self) -> Fraction:
        """The first value of the top binade's grid above max: rounding to it means overflow."""
        b = self.binades
        return self.max_value + Fraction(2) ** int(b.e_max - int(b.mbits[-1]))

    @functools.cached_property
    def finfo(self) -> FormatInfo:
        pos = self.positive_values
        normals = [self.values[c] for c in range(256)
                   if self.classes[c] == "normal" and self.values[c] > 0]
        above_one = min(v for v in pos if v > 1)
        return FormatInfo(
            name=self.name,
            max=float(pos[-1]),
            smallest_normal=float(min(normals)),
            smallest_subnormal=float(pos[0]),
            eps=float(above_one - 1),
            max_code=self.max_code,
            nan_codes=self.nan_codes,
            inf_codes=self.inf_codes,
            zero_codes=self.zero_codes,
            n_finite=len(set(Fraction(self.values[c]) for c in range(256)
                             if self.classes[c] in ("normal", "subnormal", "zero"))),
            has_negative_zero=self.has_negative_zero,
            has_inf=bool(self.inf_codes),
            scale_target=float(self._scale_target()),
        )

    def _scale_target(self) -> Fraction:
        b = self.binades
        widest = int(b.mbits.max())
        e = max(e for e, m in zip(range(b.e_low, b.e_max + 1), b.mbits.tolist()) if m == widest)
        return min(Fraction(2) ** (e + 1) - Fraction(2) ** (e - widest), self.max_value)

    @functools.lru_cache(maxsize=None)
    def decode_table(self, dtype="float32") -> np.ndarray:
        """The 256 decoded values as a read-only array of ``dtype`` (all exact).

        NaN codes decode to a quiet NaN carrying the code's sign bit where the format's NaN codes
        come in both signs (E4M3, E5M2), else a positive quiet NaN.
        """
        dt = _float_dtype(dtype)
        out = np.empty(256, dtype=np.float64)
        signed_nans = any(c & 0x80 for c in self.nan_codes) and any(not c & 0x80 for c in self.nan_codes)
        for c in range(256):
            v = self.values[c]
            if self.classes[c] == "nan":
                out[c] = -_NAN if (signed_nans and c & 0x80) else _NAN
            else:
                out[c] = float(v)
        table = out.astype(dt)
        # every value must be exact in the target type: check, never assume
        back = table.astype(np.float64)
        finite = np.isfinite(out)
        if not np.array_equal(back[finite], out[finite]):
            raise AssertionError(f"{self.name} values are not exact in {dt}")
        table.setflags(write=False)
        return table

    def table_rows(self) -> list[dict]:
        """The 256 codes as rows: code, hex, bits split by field, class, value (shortest repr).

        >>> get_format("hif8").table_rows()[0x2E]
        {'code': 46, 'hex': '0x2e', 'bits': '0|01|01|110', 'class': 'normal', 'value': '14.0'}
        """
        return [{"code": c, "hex": f"{c:#04x}", "bits": self.fields[c], "class": self.classes[c],
                 "value": repr(float(self.values[c]))} for c in range(256)]

    def table_csv(self) -> str:
        """:meth:`table_rows` as CSV text, the content of ``formats/<name>.csv``."""
        lines = ["code,hex,bits,class,value"]
        lines += [",".join(str(r[k]) for k in ("code", "hex", "bits", "class", "value"))
                  for r in self.table_rows()]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return f"Format({self.name!r})"

    def __reduce__(self):
        return (get_format, (self.name,))


@dataclasses.dataclass(frozen=True)
class BinadeTable:
    """Per-binade structure of a format's positive values, the fast encoders' only input.

    For every binade ``e`` (values in [2^e, 2^(e+1))) from ``e_low`` (the smallest value's) to
    ``e_max`` (the largest finite value's), the values are ``2^e + k * 2^(e - mbits[e])`` with
    codes ``base[e] + k``. ``top_count`` finite values lie in the top binade; rounding beyond them
    overflows. Arrays are indexed by ``e - e_low``.
    """

    e_low: int
    e_max: int
    mbits: np.ndarray  # int64
    base: np.ndarray  # int64
    top_count: int


def _binade_table(fmt: Format) -> BinadeTable:
    # Group the positive codes by binade of their *pattern* value, so that a special code at the
    # top of the grid (E4M3's NaN at "480", HiF8's Inf at "1.5 * 2^15") still fixes the spacing.
    pos = [(fmt.pattern_values[c], c) for c in range(1, 128) if fmt.pattern_values[c]]
    finite_pos = set(c for c in range(256) if fmt.classes[c] in ("normal", "subnormal")
                     and fmt.values[c] > 0)
    e_low = _floor_log2(fmt.positive_values[0])
    e_max = _floor_log2(fmt.positive_values[-1])
    mbits, base = [], []
    top_count = 0
    for e in range(e_low, e_max + 1):
        lo, hi = Fraction(2) ** e, Fraction(2) ** (e + 1)
        members = sorted((v, c) for v, c in pos if lo <= v < hi)
        if not members or members[0][0] != lo:
            raise ValueError(f"{fmt.name}: binade 2^{e} does not start at a code")
        step = (members[1][0] - members[0][0]) if len(members) > 1 else (hi - lo)
        m = _floor_log2(lo / step)
        if Fraction(2) ** (e - m) != step or len(members) != 2 ** m:
            raise ValueError(f"{fmt.name}: binade 2^{e} is not a regular power-of-two grid")
        for k, (v, c) in enumerate(members):
            if v != lo + k * step or c != members[0][1] + k:
                raise ValueError(f"{fmt.name}: binade 2^{e} codes are not consecutive")
        finite = [c for _, c in members if c in finite_pos]
        if e < e_max and len(finite) != len(members):
            raise ValueError(f"{fmt.name}: special code inside binade 2^{e}")
        if e == e_max:
            top_count = len(finite)
            if finite != [c for _, c in members[:top_count]]:
                raise ValueError(f"{fmt.name}: finite codes of the top binade are not a prefix")
        mbits.append(m)
        base.append(members[0][1])
    return BinadeTable(e_low, e_max, np.array(mbits, np.int64), np.array(base, np.int64),
                       top_count)


def _floor_log2(v: Fraction) -> int:
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    return e


def _float_dtype(dtype) -> np.dtype:
    """Resolve a float dtype name: float16, bfloat16, float32, float64."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        dtype = _bfloat16()
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"unknown dtype {dtype!r}; accepted: float16, bfloat16, float32, float64") from exc
    if dt.name not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"dtype {dt.name} is not accepted; accepted: float16, bfloat16, float32, float64")
    return dt


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TypeError("bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from exc
    return np.dtype(ml_dtypes.bfloat16)


# ------------------------------------------------------------------ decoding declarations
def _decode_binary(decl: Mapping) -> tuple[list, list, list, list]:
    """Decode the 256 codes of a sign/exponent/mantissa format (the definitional decoder)."""
    eb, mb, bias = decl["exponent_bits"], decl["mantissa_bits"], decl["bias"]
    specials = decl["specials"]
    if 1 + eb + mb != 8:
        raise ValueError(f"{decl['name']}: 1 + exponent_bits + mantissa_bits must be 8")
    if specials not in ("ieee", "fn", "fnuz"):
        raise ValueError(f"{decl['name']}: specials must be ieee, fn or fnuz, not {specials!r}")
    emax_field, mmax = (1 << eb) - 1, (1 << mb) - 1
    values, classes, fields, patterns = [], [], [], []
    for c in range(256):
        s, ef, mf = c >> 7, (c >> mb) & emax_field, c & mmax
        fields.append(f"{s}|{ef:0{eb}b}|{mf:0{mb}b}")
        if ef == 0:
            mag = Fraction(mf, 1 << mb) * Fraction(2) ** (1 - bias)
        else:
            mag = (1 + Fraction(mf, 1 << mb)) * Fraction(2) ** (ef - bias)
        patterns.append(mag if s == 0 else -mag)
        if specials == "ieee" and ef == emax_field:
            cls, v = ("inf", -math.inf if s else math.inf) if mf == 0 else ("nan", _NAN)
        elif specials == "fn" and ef == emax_field and mf == mmax:
            cls, v = "nan", _NAN
        elif specials == "fnuz" and c == 0x80:
            cls, v = "nan", _NAN
        elif mag == 0:
            cls, v = "zero", (-0.0 if s else Fraction(0))
        else:
            cls, v = ("subnormal" if ef == 0 else "normal"), (-mag if s else mag)
        values.append(v)
        classes.append(cls)
    return values, classes, fields, patterns


def _decode_tapered(decl: Mapping) -> tuple[list, list, list, list]:
    """Decode the 256 codes of a HiF8-like tapered format (the definitional decoder).

    Bit layout (7 bits below the sign): ``dot prefix | exponent field (D bits) | mantissa``.
    """
    dots = decl["dot"]
    den = decl["denormal"]
    codes = decl["codes"]
    rows = [(d["prefix"], d["exponent_bits"], d["mantissa_bits"]) for d in dots]
    rows.append((den["prefix"], None, den["mantissa_bits"]))
    for prefix, d, m in rows:
        if len(prefix) + (d or 0) + m != 7:
            raise ValueError(f"{decl['name']}: dot {prefix} fields do not fill 7 bits")
    nan_codes = set(codes["nan"])
    values, classes, fields, patterns = [], [], [], []
    for c in range(256):
        s, bits = c >> 7, f"{c & 0x7F:07b}"
        prefix, d, m = next(r for r in rows if bits.startswith(r[0]))
        rest = bits[len(prefix):]
        if d is None:  # denormal extension
            mf = int(rest, 2)
            mag = Fraction(2) ** (mf + den["exponent_offset"]) if mf else Fraction(0)
            fields.append(f"{s}|{prefix}|{rest}")
            sub = True
        else:
            ef, mf = rest[:d], int(rest[d:], 2)
            if d == 0:
                e = 0
            else:
                e = (1 << (d - 1)) | int(ef[1:] or "0", 2)
                e = -e if ef[0] == "1" else e
            mag = (1 + Fraction(mf, 1 << m)) * Fraction(2) ** e
            fields.append(f"{s}|{prefix}|{ef}|{rest[d:]}" if d else f"{s}|{prefix}|{rest}")
            sub = False
        patterns.append(mag if s == 0 else -mag)
        if c in nan_codes:
            cls, v = "nan", _NAN
        elif c == codes["positive_inf"]:
            cls, v = "inf", math.inf
        elif c == codes["negative_inf"]:
            cls, v = "inf", -math.inf
        elif mag == 0:
            if c != codes["zero"]:
                raise ValueError(f"{decl['name']}: code {c:#04x} is a zero pattern but not declared")
            cls, v = "zero", Fraction(0)
        else:
            cls, v = ("subnormal" if sub else "normal"), (-mag if s else mag)
        values.append(v)
        classes.append(cls)
    return values, classes, fields, patterns


_DECODERS = {"binary": _decode_binary, "tapered": _decode_tapered}


def _build(decl: Mapping) -> Format:
    for key in ("name", "kind", "default_rounding"):
        if key not in decl:
            raise ValueError(f"format declaration lacks {key!r}")
    if decl["kind"] not in _DECODERS:
        raise ValueError(f"{decl['name']}: unknown kind {decl['kind']!r}; known: {', '.join(_DECODERS)}")
    if decl["default_rounding"] not in ROUNDING_MODES:
        raise ValueError(f"{decl['name']}: default_rounding must be one of {ROUNDING_MODES}")
    values, classes, fields, patterns = _DECODERS[decl["kind"]](decl)
    nan_encode = tuple(decl.get("nan_encode") or decl["codes"]["nan_encode"])
    if len(nan_encode) != 2 or any(classes[c] != "nan" for c in nan_encode):
        raise ValueError(f"{decl['name']}: nan_encode must be two NaN codes (positive, negative input)")
    fmt = Format(
        name=decl["name"],
        aliases=tuple(decl.get("aliases", ())),
        description=decl.get("description", ""),
        source=decl.get("source", ""),
        kind=decl["kind"],
        default_rounding=decl["default_rounding"],
        values=tuple(values),
        classes=tuple(classes),
        fields=tuple(fields),
        pattern_values=tuple(patterns),
        nan_encode=nan_encode,  # type: ignore[arg-type]
        declaration=MappingProxyType(dict(decl)),
    )
    _check_sign_symmetry(fmt)
    fmt.binades  # validates the grid structure the fast paths rely on
    return fmt


def _check_sign_symmetry(fmt: Format) -> None:
    """Every finite nonzero code c has its negation at c ^ 0x80 (sign is the top bit)."""
    for c in range(128):
        if fmt.classes[c] in ("normal", "subnormal"):
            if fmt.values[c ^ 0x80] != -fmt.values[c]:
                raise ValueError(f"{fmt.name}: code {c ^ 0x80:#04x} is not the negation of {c:#04x}")


@functools.lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, Format], dict[str, str]]:
    formats: dict[str, Format] = {}
    names: dict[str, str] = {}
    for path in sorted(data_dir("formats").glob("*.toml")):
        with open(path, "rb") as fh:
            decl = tomllib.load(fh)
        fmt = _build(decl)
        if path.stem != fmt.name:
            raise ValueError(f"{path.name} declares {fmt.name!r}; the file must be named {fmt.name}.toml")
        formats[fmt.name] = fmt
        for key in (fmt.name, *fmt.aliases):
            key = key.lower()
            if key in names:
                raise ValueError(f"format name or alias {key!r} declared twice")
            names[key] = fmt.name
    return formats, names


def list_formats() -> list[str]:
    """Canonical names of all declared formats.

    >>> list_formats()
    ['e4m3', 'e4m3fnuz', 'e5m2', 'e5m2fnuz', 'hif8']
    """
    return list(_registry()[0])


def get_format(fmt: "str | Format") -> Format:
    """Look a format up by name or alias (case-insensitive); a :class:`Format` passes through.

    >>> get_format("float8_e4m3fn")
    Format('e4m3')
    >>> get_format("float8_e4m3")
    Traceback (most recent call last):
        ...
    ValueError: unknown format 'float8_e4m3'; known: e4m3, e4m3fnuz, e5m2, e5m2fnuz, hif8 (aliases: e4m3fn, float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, hifloat8, hifp8, ocp_e4m3, ocp_e5m2)
    """
    if isinstance(fmt, Format):
        return fmt
    formats, names = _registry()
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a name (str) or a Format, not {type(fmt).__name__}")
    key = names.get(fmt.lower())
    if key is None:
        aliases = sorted(k for k, v in names.items() if k != v)
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(formats)} "
                         f"(aliases: {', '.join(aliases)})")
    return formats[key]


def finfo(fmt: "str | Format") -> FormatInfo:
    """The finfo-like record of a format.

    >>> fi = finfo("hif8")
    >>> fi.max, fi.smallest_subnormal == 2.0**-22, fi.n_finite, fi.nan_codes, fi.inf_codes
    (32768.0, True, 253, (128,), (111, 239))
    """
    return get_format(fmt).finfo


def write_tables(folder: "Path | None" = None) -> list[Path]:
    """Write each format's 256-code table beside its declaration (``formats/<name>.csv``).

    The tables are for review; a test checks that the committed files equal the derived ones.
    After editing a declaration run
    ``python -c "import fp8lab.formats as f; f.write_tables()"``.
    """
    folder = Path(folder) if folder is not None else data_dir("formats")
    paths = []
    for name in list_formats():
        path = folder / f"{name}.csv"
        path.write_text(get_format(name).table_csv())
        paths.append(path)
    return paths

