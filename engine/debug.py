"""FERRY_DEBUG=1: one stderr line per node output, to find where a model goes wrong on device."""

from __future__ import annotations

import os
import sys

import numpy as np


def enabled() -> bool:
    return os.environ.get("FERRY_DEBUG", "") not in ("", "0")


def describe(array: np.ndarray) -> str:
    text = f"shape={tuple(array.shape)} dtype={array.dtype.name}"
    if array.size == 0 or array.dtype.kind not in "biuf":
        return text
    return f"{text} min={_scalar(array.min())} max={_scalar(array.max())}"


def _scalar(value: np.generic) -> str:
    return f"{float(value):.6g}" if isinstance(value, np.floating) else str(value)


def report(node: str, op: str, output: str, array: np.ndarray) -> None:
    print(f"[ferry] {node} ({op}) -> {output}: {describe(array)}", file=sys.stderr)


def report_input(node: str, op: str, name: str, array: np.ndarray) -> None:
    print(f"[ferry] {node} ({op}) <- {name}: {describe(array)}", file=sys.stderr)
