"""fp8lab: bit-exact 8-bit floating-point numerics.

Formats (declared once in ``formats/``): OCP E4M3 and E5M2, Huawei HiF8, and the FNUZ variants
E4M3FNUZ / E5M2FNUZ. The codecs are exact for every rounding mode and overflow policy.

>>> import fp8lab
>>> fp8lab.list_formats()
['e4m3', 'e4m3fnuz', 'e5m2', 'e5m2fnuz', 'hif8']
>>> fp8lab.decode(fp8lab.encode([0.3], "hif8"), "hif8", dtype="float64")
array([0.3125])
"""

from .codecs import decode, encode
from .formats import ROUNDING_MODES, Format, FormatInfo, finfo, get_format, list_formats
from .qtensor import QTensor, quantize
from .scaling import DelayedScaling, Scaling
from . import gemm, metrics

__version__ = "0.1.0"

__all__ = [
    "encode",
    "decode",
    "get_format",
    "list_formats",
    "finfo",
    "Format",
    "FormatInfo",
    "ROUNDING_MODES",
    "quantize",
    "QTensor",
    "Scaling",
    "DelayedScaling",
    "gemm",
    "metrics",
    "__version__",
]
