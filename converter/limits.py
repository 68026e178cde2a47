"""Size limits on what the converter accepts, so a hostile or broken model fails fast instead of
exhausting the worker's memory.  Defaults suit the control plane; each can be set in the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1 << 30


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of bytes, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


@dataclass(frozen=True)
class Limits:
    """``max_model_bytes``: the .onnx file plus its external weight files.
    ``max_tensor_bytes``: any one tensor (initializer, or a value whose inferred shape is known)."""

    max_model_bytes: int = 2 * GIB
    max_tensor_bytes: int = 1 * GIB

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            max_model_bytes=_env_int("FERRY_CONVERTER_MAX_MODEL_BYTES", cls.max_model_bytes),
            max_tensor_bytes=_env_int("FERRY_CONVERTER_MAX_TENSOR_BYTES", cls.max_tensor_bytes),
        )
