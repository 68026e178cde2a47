"""Softmax and LogSoftmax, with the pre-opset-13 meaning (flatten to 2-D at axis) kept apart."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.ops.common import normalize_axis
from engine.ops.registry import legacy, register


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _flattened(fn, x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    axis = normalize_axis(int(attrs.get("axis", 1)), x.ndim)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return fn(x.reshape(rows, -1), 1).reshape(x.shape)


@register("Softmax")
def softmax(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [_softmax(x, normalize_axis(int(attrs.get("axis", -1)), x.ndim))]


@register("LogSoftmax")
def log_softmax(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    return [_log_softmax(x, normalize_axis(int(attrs.get("axis", -1)), x.ndim))]


@legacy("Softmax", since=13)
def softmax_2d(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [_flattened(_softmax, inputs[0], attrs)]


@legacy("LogSoftmax", since=13)
def log_softmax_2d(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [_flattened(_log_softmax, inputs[0], attrs)]
