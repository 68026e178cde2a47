"""The conversion options, validated once: precision, int4 block size, mixed precision, calibration.

``ConversionOptions`` is what convert() runs with.  Build one with ``from_dict`` from whatever
a caller holds (the CLI's arguments, a version's stored options, a request's fields): every
check lives here, and a bad value raises ``InvalidOptionsError`` naming the option, what is
wrong and what to pass instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from converter.calibrate import DYNAMIC, METHODS
from converter.calibrate import MODES as ACTIVATION_METHODS
from converter.errors import ConversionError
from converter.quantize import BLOCK_SIZES, QUANTIZE_MODES

PRECISIONS = tuple(mode for mode in QUANTIZE_MODES if mode is not None)  # None: float32 weights
INTEGER_PRECISIONS = ("int8", "int4")  # the ones mixed precision and int8 activations build on
FIRST_LAST = "first_last"
DEFAULT_BLOCK_SIZE = 32


class InvalidOptionsError(ConversionError, ValueError):
    """A conversion option is invalid; ``option`` names it (for a form or API field error)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class ConversionOptions:
    """How to convert; every instance is valid (checked on construction).

    ``calibration``: the samples (a dict of input arrays, a list of them, or an .npz path), or
    None.  A caller that stores a reference to them instead swaps in the samples with
    ``dataclasses.replace`` before converting; validity only depends on whether there are some.
    """

    quantize: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    keep_float: str | tuple[str, ...] | None = None  # "first_last" or node names to keep float32
    accuracy_budget: float | None = None  # minimum cosine similarity of every output vs float32
    activations: str | None = None  # int8 activations: a calibration method, or "dynamic"
    calibration: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.keep_float, list):  # a list is accepted, a tuple is stored (frozen)
            object.__setattr__(self, "keep_float", tuple(self.keep_float))
        _check_precision(self.quantize, self.block_size)
        _check_mixed_precision(self.quantize, self.keep_float, self.accuracy_budget)
        _check_activations(self.activations, self.quantize, self.calibration)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConversionOptions:
        """Options from loosely typed fields: absent, None and "" mean "not set"; ``keep_float``
        may be comma-separated names; numbers may be strings.  Unknown keys are refused."""
        unknown = sorted(set(data) - set(OPTION_NAMES))
        if unknown:
            known = ", ".join(OPTION_NAMES)
            raise InvalidOptionsError(
                unknown[0], f"unknown conversion option(s) {unknown}; the options are {known}"
            )
        given = {k: v for k, v in data.items() if v is not None and v != ""}
        if "block_size" in given:
            given["block_size"] = _number(given["block_size"], "block_size", int)
        if "accuracy_budget" in given:
            given["accuracy_budget"] = _number(given["accuracy_budget"], "accuracy_budget", float)
        if isinstance(given.get("keep_float"), str) and given["keep_float"] != FIRST_LAST:
            names = tuple(name.strip() for name in given["keep_float"].split(",") if name.strip())
            given["keep_float"] = names or None
        return cls(**given)

    @property
    def mixed_precision(self) -> bool:
        return bool(self.keep_float) or self.accuracy_budget is not None


# the keys from_dict takes: a caller whose dict holds more (e.g. a device class) picks these
OPTION_NAMES = tuple(f.name for f in fields(ConversionOptions))


def _number(value: Any, option: str, kind: type) -> Any:
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            raise InvalidOptionsError(option, f"{option} must be a number, not {value!r}") from None
    return value


def _check_precision(quantize: Any, block_size: Any) -> None:
    if quantize not in QUANTIZE_MODES:
        raise InvalidOptionsError(
            "quantize",
            f"quantize={quantize!r} is not a known mode; use one of {', '.join(PRECISIONS)}, "
            "or leave it out for float32 weights",
        )
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise InvalidOptionsError(
            "block_size",
            f"block_size must be a positive int (one of {BLOCK_SIZES} for int4), got {block_size!r}",
        )
    if quantize == "int4" and block_size not in BLOCK_SIZES:
        raise InvalidOptionsError(
            "block_size", f"block_size must be one of {BLOCK_SIZES} for int4, got {block_size}"
        )


def _check_mixed_precision(quantize: str | None, keep_float: Any, budget: Any) -> None:
    if (keep_float or budget is not None) and quantize not in INTEGER_PRECISIONS:
        option = "keep_float" if keep_float else "accuracy_budget"
        raise InvalidOptionsError(
            option,
            "keep_float and accuracy_budget apply only to quantize='int8' or 'int4' "
            f"(quantize is {quantize!r}): add quantize='int8' or drop {option}",
        )
    if keep_float is not None and not (
        keep_float == FIRST_LAST
        or isinstance(keep_float, tuple)
        and all(isinstance(name, str) and name for name in keep_float)
    ):
        raise InvalidOptionsError(
            "keep_float",
            f"keep_float must be '{FIRST_LAST}' or a list of node names, not {keep_float!r}",
        )
    if budget is not None and (
        isinstance(budget, bool)
        or not isinstance(budget, int | float)
        or not math.isfinite(budget)
        or not 0.0 < budget <= 1.0
    ):
        raise InvalidOptionsError(
            "accuracy_budget",
            f"accuracy_budget is a minimum cosine similarity in (0, 1], e.g. 0.999, not {budget!r}",
        )


def _check_activations(method: Any, quantize: str | None, calibration: Any) -> None:
    if method is None:
        return
    if method not in ACTIVATION_METHODS:
        raise InvalidOptionsError(
            "activations",
            f"activations={method!r} is not an int8 activation mode; use one of {ACTIVATION_METHODS} "
            f"({', '.join(METHODS)}: static, calibrated; {DYNAMIC}: ranges computed per run)",
        )
    kind = "dynamic" if method == DYNAMIC else "static"
    if quantize not in INTEGER_PRECISIONS:
        raise InvalidOptionsError(
            "quantize",
            f"{kind} int8 activations need quantize='int8' or 'int4' weights (quantize is {quantize!r})",
        )
    if calibration is None and method != DYNAMIC:
        raise InvalidOptionsError(
            "calibration",
            "static int8 activations need calibration samples (calibration=...): "
            "an .npz or a dict of arrays, one per model input; or use activations='dynamic'",
        )
