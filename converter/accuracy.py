"""The accuracy report: how far a reduced-precision package's outputs are from the float32 one's.

Inputs are the user's calibration samples when given, else seeded random ones.  For each
output: max and mean absolute error, cosine similarity and, for outputs whose last axis looks
like classes (rank >= 2, more than one entry), top-1 agreement of the argmax over that axis.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import ConversionError

RANDOM_SAMPLES = 4
Feeds = dict[str, np.ndarray]


class CalibrationError(ConversionError):
    """The calibration samples do not fit the model's inputs."""


def calibration_feeds(calibration: Any, specs: list[dict[str, Any]]) -> list[Feeds]:
    """Calibration data as a list of feeds: a dict of arrays (one feed, e.g. a whole batch), a list
    of such dicts, or the path of an .npz file holding one array per model input."""
    if isinstance(calibration, str | os.PathLike):
        calibration = _load_npz(Path(calibration))
    samples = [calibration] if isinstance(calibration, Mapping) else calibration
    if not isinstance(samples, Sequence) or not samples:
        raise CalibrationError(
            "calibration must be a dict of input arrays, a non-empty list of them, or an .npz path"
        )
    return [_feed(sample, specs, index) for index, sample in enumerate(samples)]


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"calibration file {path}: not a readable .npz of arrays ({exc})") from exc


def _feed(sample: Any, specs: list[dict[str, Any]], index: int) -> Feeds:
    where = f"calibration sample {index}"
    if not isinstance(sample, Mapping):
        raise CalibrationError(
            f"{where}: expected a dict of input name -> array, got {type(sample).__name__}"
        )
    names = [spec["name"] for spec in specs]
    unknown = sorted(set(sample) - set(names))
    missing = [name for name in names if name not in sample]
    if unknown or missing:
        raise CalibrationError(
            f"{where}: inputs {missing} missing, {unknown} unknown (the model has {names})"
        )
    feed = {}
    for spec in specs:
        array = np.asarray(sample[spec["name"]])
        shape = spec["shape"]
        if shape is not None and (
            array.ndim != len(shape)
            or any(isinstance(d, int) and d != a for d, a in zip(shape, array.shape, strict=True))
        ):
            raise CalibrationError(
                f"{where}: input {spec['name']!r} has shape {list(array.shape)}, the model needs {shape}"
            )
        if not np.can_cast(array.dtype, spec["dtype"], casting="same_kind"):
            raise CalibrationError(
                f"{where}: input {spec['name']!r} is {array.dtype}, the model needs {spec['dtype']}"
            )
        feed[spec["name"]] = np.ascontiguousarray(array.astype(spec["dtype"], copy=False))
    return feed


def random_feeds(specs: list[dict[str, Any]], seed: int) -> list[Feeds]:
    from converter.selftest import make_inputs  # here: selftest imports the engine session

    return [make_inputs(specs, seed=seed + i) for i in range(RANDOM_SAMPLES)]


def compare_outputs(got: list[Feeds], reference: list[Feeds]) -> dict[str, dict[str, float | None]]:
    """Per output: max/mean abs error, cosine similarity and top-1 agreement over all samples."""
    report = {}
    for name in sorted(reference[0]):
        a = [g[name].astype(np.float64) for g in got]
        b = [r[name].astype(np.float64) for r in reference]
        flat_a = np.concatenate([x.reshape(-1) for x in a])
        flat_b = np.concatenate([x.reshape(-1) for x in b])
        diff = np.abs(flat_a - flat_b)
        norms = float(np.linalg.norm(flat_a) * np.linalg.norm(flat_b))
        cosine = float(flat_a @ flat_b / norms) if norms > 0 else float(np.array_equal(flat_a, flat_b))
        report[name] = {
            "max_abs_error": float(diff.max(initial=0.0)),
            "mean_abs_error": float(diff.mean()) if diff.size else 0.0,
            "cosine_similarity": cosine,
            "top1_agreement": _top1(a, b),
        }
    return report


def _top1(got: list[np.ndarray], reference: list[np.ndarray]) -> float | None:
    if reference[0].ndim < 2 or reference[0].shape[-1] < 2:
        return None
    same = [np.argmax(g, axis=-1) == np.argmax(r, axis=-1) for g, r in zip(got, reference, strict=True)]
    return float(np.mean(np.concatenate([s.reshape(-1) for s in same])))


def worst_cosine(outputs: dict[str, dict[str, float | None]]) -> float:
    return min(float(o["cosine_similarity"]) for o in outputs.values()) if outputs else 1.0
