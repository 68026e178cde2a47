"""Versions uploaded as a checkpoint archive: a language model (``convert-llm``) or a diffusion
layout (``convert-diffusion``). Their options are checked at upload; the conversion job extracts
the archive (registry.archives) and calls the converter's public functions on the directory.

The converter writes its package atomically (a temporary name, renamed at the end), so a
checkpoint it refuses leaves no package; the job's temporary directory goes with the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converter.diffusion.convert import DiffusionOptions, convert_diffusion
from converter.errors import ConversionError
from converter.llm.convert import convert_llm
from registry.archives import extract_archive
from registry.errors import InvalidUpload

Progress = Callable[[float, str], None]

# What each kind may be converted to, and its default (the converters' own choices, narrowed to
# what a device release makes sense at: llm fp32 is only a reference; diffusion fp16 is not offered).
WEIGHTS = {"llm": ("fp16", "int8", "int4"), "diffusion": ("fp32", "int8")}
DEFAULT_WEIGHTS = {"llm": "int4", "diffusion": "fp32"}
LLM_BLOCKS = (32, 64)
OPTIONS = {
    "llm": ("weights", "block_size"),
    "diffusion": ("weights", "image_size", "steps"),
    "llm_adapter": (),  # converted against its base (registry.adapters)
}
IMAGE_SIZES = range(32, 2049)
STEPS = range(1, 101)


@dataclass(frozen=True)
class Converted:
    report: dict[str, Any]
    summary: str  # the job log's accuracy line


def check_options(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """The version's options for ``kind``, with defaults filled in; InvalidUpload names the field."""
    foreign = sorted(set(options) - set(OPTIONS[kind]))
    if kind == "llm_adapter" and not foreign:
        return {}  # an adapter keeps its base's precision: nothing to choose
    if foreign:
        name = foreign[0]
        raise _invalid(
            name,
            f"{name} does not apply to kind {kind!r} (its options: {', '.join(OPTIONS[kind]) or 'none'}).",
        )
    checked = {"weights": options.get("weights") or DEFAULT_WEIGHTS[kind]}
    if checked["weights"] not in WEIGHTS[kind]:
        raise _invalid(
            "weights", f"weights {checked['weights']!r} is not one of {', '.join(WEIGHTS[kind])} for {kind}."
        )
    if kind == "llm":
        checked["block_size"] = int(options.get("block_size") or 32)
        if checked["block_size"] not in LLM_BLOCKS:
            raise _invalid("block_size", f"block_size must be one of {', '.join(map(str, LLM_BLOCKS))}.")
        return checked
    checked["image_size"] = _int_in(options, "image_size", 512, IMAGE_SIZES)
    if checked["image_size"] % 8:
        raise _invalid("image_size", "image_size must be a multiple of 8.")
    checked["steps"] = _int_in(options, "steps", 20, STEPS)
    return checked


def _int_in(options: dict[str, Any], name: str, default: int, allowed: range) -> int:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise _invalid(name, f"{name} must be an integer from {allowed.start} to {allowed.stop - 1}.")
    return value


def _invalid(field: str, message: str) -> InvalidUpload:
    return InvalidUpload(message, fields={field: [message]})


def convert_archive(
    kind: str, archive: Path, workdir: Path, dst: Path, options: dict[str, Any], progress: Progress
) -> Converted:
    """Extract ``archive`` under ``workdir`` and convert it into the unsigned package ``dst``.

    Raises ConversionError (or InvalidUpload for a hostile archive) with the checkpoint's own
    relative paths in the message, never the worker's temporary ones."""
    root = extract_archive(archive, workdir)
    progress(0.02, "archive extracted")
    options = check_options(kind, options)
    try:
        if kind == "llm":
            return _llm(root, dst, options, progress)
        return _diffusion(root, dst, options, progress)
    except ConversionError as exc:
        raise ConversionError(_relative(str(exc), root)) from None


def _llm(root: Path, dst: Path, options: dict[str, Any], progress: Progress) -> Converted:
    report = convert_llm(
        root, dst, weights=options["weights"], block=options["block_size"], progress=progress
    ).to_dict()
    report["source"] = "the uploaded archive"
    a = report["accuracy"]
    summary = (
        f"accuracy of {report['precision']} vs fp32 over {a['tokens']} tokens: top-1 agreement "
        f"{a['top1_agreement']:.1%}, mean KL {a['mean_kl']:.4g} nats, perplexity {a['perplexity']:.4g} "
        f"(fp32: {a['fp32_perplexity']:.4g}); weights {report['weights_bytes']:,} bytes"
    )
    return Converted(report, summary)


def _diffusion(root: Path, dst: Path, options: dict[str, Any], progress: Progress) -> Converted:
    size = options["image_size"]
    settings = DiffusionOptions(
        weights=options["weights"], size=size, steps=options["steps"], accuracy_steps=options["steps"]
    )
    report = convert_diffusion(root, dst, options=settings, progress=progress).to_dict()
    report["source"] = "the uploaded archive"
    parts = []
    for name, graph in report["graphs"].items():
        outputs = (graph.get("accuracy") or {}).get("outputs", {})
        cosines = [figures["cosine_similarity"] for figures in outputs.values()]
        parts.append(
            f"{name} cosine {min(cosines):.6f}" if cosines else f"{name} {graph['nodes_after']} nodes"
        )
    pipeline = report.get("pipeline")
    if pipeline:
        parts.append(f"image PSNR {pipeline['psnr_db']:.2f} dB, SSIM {pipeline['ssim']:.4f} vs fp32")
    return Converted(report, f"accuracy of {report['precision']}: " + "; ".join(parts))


def _relative(message: str, root: Path) -> str:
    """The converter names files by their path: show them relative to the uploaded directory."""
    for path in (str(root.resolve()), str(root)):
        message = message.replace(path + "/", "").replace(path, "the uploaded archive")
    return message
