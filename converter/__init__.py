"""ONNX -> Ferry package converter (runs in the control plane, never on devices)."""

from converter.convert import CONVERTER_VERSION, ConversionReport, convert
from converter.errors import (
    ConversionError,
    InvalidModelError,
    SelfTestError,
    UnsupportedOperatorsError,
)
from converter.limits import Limits

__version__ = CONVERTER_VERSION

__all__ = [
    "ConversionError",
    "ConversionReport",
    "InvalidModelError",
    "Limits",
    "SelfTestError",
    "UnsupportedOperatorsError",
    "__version__",
    "convert",
]
