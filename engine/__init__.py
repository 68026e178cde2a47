"""Ferry's on-device inference engine: numpy kernels everywhere, JIT (numba) kernels where installed."""

from engine.errors import (
    EngineError,
    InputError,
    NodeExecutionError,
    PackageError,
    PackageIntegrityError,
    UnsupportedOperatorError,
)
from engine.ops import supported_operators
from engine.program import unsupported_nodes
from engine.session import NodeTiming, SelfTestResult, Session
from engine.tensor_specs import TensorSpec

__all__ = [
    "EngineError",
    "InputError",
    "NodeExecutionError",
    "NodeTiming",
    "PackageError",
    "PackageIntegrityError",
    "SelfTestResult",
    "Session",
    "TensorSpec",
    "UnsupportedOperatorError",
    "supported_operators",
    "unsupported_nodes",
]
