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
    ``max_tensor_bytes``: any one tensor (initializer, or a value whose inferred shape is known).
    ``large_model_bytes``: not a limit but where the large-model route starts: a model whose
    weights sit in external files and whose total passes it keeps them on disk (memory-mapped
    when translated) and is checked through its path, never serialized whole (protobuf cannot
    hold 2 GB in one message).  Tests lower it to run that route on small models."""

    max_model_bytes: int = 2 * GIB
    max_tensor_bytes: int = 1 * GIB
    large_model_bytes: int = 1 * GIB

    @classmethod
    def from_env(cls, max_model_bytes: int | None = None) -> Limits:
        """The limits the environment sets; ``max_model_bytes`` replaces the default model limit
        (the diffusion converter's is larger), the environment's still wins when set."""
        return cls(
            max_model_bytes=_env_int(
                "FERRY_CONVERTER_MAX_MODEL_BYTES", max_model_bytes or cls.max_model_bytes
            ),
            max_tensor_bytes=_env_int("FERRY_CONVERTER_MAX_TENSOR_BYTES", cls.max_tensor_bytes),
            large_model_bytes=_env_int("FERRY_CONVERTER_LARGE_MODEL_BYTES", cls.large_model_bytes),
        )
