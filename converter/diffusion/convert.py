"""``convert_diffusion``: the diffusers/optimum ONNX layout -> one Ferry diffusion package.

Each graph goes through the ordinary converter (validation, the optimisation passes, GroupNorm
and attention included, weights at the chosen precision, its own accuracy report against fp32
on inputs the pipeline really feeds it).  Then the pipeline itself is measured: the same prompt
and seed through the fp32 graphs and through the converted ones, the two images compared by
PSNR and SSIM.  A 2-step image from a fixed seed is recorded for the device's health check.
The package is written to ``<dst>.tmp`` and renamed (signed first when a release key is given,
with deploy.package's signing, as the control plane signs every package); a failure leaves
nothing under ``dst``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converter.convert import CONVERTER_VERSION, convert, package_destination
from converter.diffusion.layout import Layout, read_layout
from converter.errors import ConversionError
from converter.limits import GIB, Limits
from deploy.package import MANIFEST, Manifest, SignedClaims, file_sha256, sign_package
from deploy.package.writer import write_entries
from engine import Session
from engine.diffusion.errors import DiffusionError
from engine.diffusion.package import (
    ACCURACY,
    KIND,
    SCHEDULER,
    SELFTEST_IMAGE,
    SPEC,
    TOKENIZER,
    DiffusionSpec,
    SelfTest,
)
from engine.diffusion.pipeline import DiffusionPipeline, GenerationRequest
from engine.diffusion.quality import psnr, ssim
from engine.diffusion.schedulers import NAMES

PRECISIONS = ("fp32", "fp16", "int8")
ACCURACY_PROMPT = "a red ferry crossing a calm sea at sunset"
ACCURACY_SEED = 1234
Progress = Callable[[float, str], None]
# SD-1.5's UNet is 3.4 GB of float32 weights (in an external file): past the converter's 2 GiB
# default, so a diffusion layout's graphs get this default instead (FERRY_CONVERTER_MAX_MODEL_BYTES
# still sets it).  Graphs this large take the converter's large-model route (converter.limits).
MAX_MODEL_BYTES = 4 * GIB


def diffusion_limits() -> Limits:
    """The size limits a diffusion layout's graphs are converted under."""
    try:
        return Limits.from_env(max_model_bytes=MAX_MODEL_BYTES)
    except ValueError as exc:
        raise ConversionError(str(exc)) from exc


@dataclass(frozen=True)
class DiffusionOptions:
    weights: str = "fp32"
    size: int = 512  # the default image size (square)
    min_size: int | None = None  # default: size // 2
    max_size: int | None = None  # default: size * 3 // 2
    size_multiple: int = 8
    steps: int = 20
    guidance_scale: float = 7.5
    scheduler: str = "dpmpp_2m"
    accuracy_steps: int = 20
    threads: int | None = None

    def check(self) -> None:
        if self.weights not in PRECISIONS:
            raise ConversionError(f"weights {self.weights!r} is not one of {', '.join(PRECISIONS)}")
        if self.scheduler not in NAMES:
            raise ConversionError(f"scheduler {self.scheduler!r} is not one of {', '.join(NAMES)}")
        for name in ("size", "size_multiple", "steps", "accuracy_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConversionError(f"{name} must be a positive integer, got {value!r}")
        if self.size % self.size_multiple:
            raise ConversionError(f"size {self.size} is not a multiple of size_multiple {self.size_multiple}")


@dataclass
class DiffusionConversionReport:
    source: str
    precision: str
    graphs: dict[str, dict[str, Any]]
    pipeline: dict[str, Any] | None
    selftest: dict[str, Any]
    fp32_size: int
    converted_size: int
    size_ratio: float
    package_size: int = 0
    signed: bool = False
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def stored(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_dict().items() if k not in ("source", "package_size", "seconds")}


def convert_diffusion(
    source: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    options: DiffusionOptions | None = None,
    sign_key: bytes | None = None,
    claims: SignedClaims | None = None,
    progress: Progress | None = None,
) -> DiffusionConversionReport:
    """Convert the layout under ``source`` into the diffusion package ``dst``."""
    started = time.perf_counter()
    options = options or DiffusionOptions()
    options.check()
    say = progress or (lambda fraction, message: None)
    dst = package_destination(dst)
    say(0.02, "reading the layout")
    layout = read_layout(source)
    with tempfile.TemporaryDirectory(prefix="ferry-diffusion-") as tmp:
        reference, converted = Path(tmp) / "fp32", Path(tmp) / options.weights
        spec = _spec(layout, options)
        for directory in {reference, converted}:
            _write_side_files(directory, layout, spec)
        graphs = _convert_graphs(layout, options, spec, reference, converted, say)
        try:
            say(0.7, "measuring the image against fp32")
            pipeline = _pipeline_accuracy(reference, converted, options) if converted != reference else None
            say(0.85, "recording the health check's image")
            image = DiffusionPipeline(converted, threads=1).generate(_selftest_request(spec.selftest)).image
        except DiffusionError as exc:
            raise ConversionError(f"the converted pipeline does not run: {exc}") from exc
        buffer = io.BytesIO()
        np.save(buffer, image, allow_pickle=False)
        (converted / SELFTEST_IMAGE).write_bytes(buffer.getvalue())
        fp32_size = sum((reference / f).stat().st_size for f in spec.graphs.values())
        size = sum((converted / f).stat().st_size for f in spec.graphs.values())
        report = DiffusionConversionReport(
            source=str(source),
            precision=options.weights,
            graphs=graphs,
            pipeline=pipeline,
            selftest={**dataclasses.asdict(spec.selftest), "image": SELFTEST_IMAGE},
            fp32_size=fp32_size,
            converted_size=size,
            size_ratio=round(size / fp32_size, 4),
        )
        (converted / ACCURACY).write_text(json.dumps(report.stored(), indent=1, sort_keys=True))
        say(0.95, "writing the package")
        report.files = _write_package(converted, dst, spec, report, sign_key, claims)
    report.signed = sign_key is not None
    report.package_size = dst.stat().st_size
    report.seconds = round(time.perf_counter() - started, 2)
    say(1.0, "done")
    return report


def _spec(layout: Layout, options: DiffusionOptions) -> DiffusionSpec:
    multiple = max(options.size_multiple, layout.vae_scale_factor)
    if multiple % layout.vae_scale_factor:
        raise ConversionError(
            f"size_multiple {multiple} is not a multiple of the VAE's {layout.vae_scale_factor}"
        )
    min_size = options.min_size or max(multiple, options.size // 2 // multiple * multiple)
    max_size = options.max_size or options.size * 3 // 2 // multiple * multiple
    if not min_size <= options.size <= max_size:
        raise ConversionError(f"need min_size ({min_size}) <= size ({options.size}) <= max_size ({max_size})")
    try:
        spec = DiffusionSpec(
            graphs={name: f"{name}.ferry" for name in layout.graphs},
            latent_channels=layout.latent_channels,
            vae_scale_factor=layout.vae_scale_factor,
            scaling_factor=layout.scaling_factor,
            text_width=layout.text_width,
            max_length=layout.tokenizer.max_length,
            pad_token=layout.tokenizer.settings()["pad_token"],
            default_size=options.size,
            min_size=min_size,
            max_size=max_size,
            size_multiple=multiple,
            default_steps=options.steps,
            max_steps=max(100, options.steps),
            guidance_scale=options.guidance_scale,
            scheduler=options.scheduler,
            precision=options.weights,
            selftest=SelfTest(size=min_size, guidance_scale=options.guidance_scale),
        )
        spec.check()
    except DiffusionError as exc:
        raise ConversionError(str(exc)) from exc
    return spec


def _write_side_files(directory: Path, layout: Layout, spec: DiffusionSpec) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SPEC).write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True))
    (directory / TOKENIZER).write_text(layout.tokenizer.to_json(), encoding="utf-8")
    (directory / SCHEDULER).write_text(json.dumps(layout.scheduler, indent=1, sort_keys=True))


def _input_dtype(path: Path, name: str | None = None) -> np.dtype:
    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name not in inits and (name is None or value.name == name):
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    raise ConversionError(f"{path}: has no input {name!r}")


def _convert_graphs(
    layout: Layout,
    options: DiffusionOptions,
    spec: DiffusionSpec,
    reference: Path,
    converted: Path,
    say: Progress,
) -> dict[str, dict[str, Any]]:
    """Each graph through the converter, on the inputs the pipeline feeds it at the default size."""
    rng = np.random.default_rng(ACCURACY_SEED)
    limits = diffusion_limits()
    ids_dtype = _input_dtype(layout.graphs["text_encoder"])
    ids = np.array([layout.tokenizer.encode(p) for p in ("", ACCURACY_PROMPT)], dtype=ids_dtype)
    latent = (options.size // spec.vae_scale_factor,) * 2
    reports: dict[str, dict[str, Any]] = {}
    context: np.ndarray | None = None
    for index, name in enumerate(spec.graphs):
        if name == "text_encoder":
            (key,) = _input_names(layout.graphs[name])
            feeds = {key: ids}
        elif name == "unet":
            time_dtype = _input_dtype(layout.graphs[name], "timestep")
            feeds = {
                "sample": rng.standard_normal((2, spec.latent_channels, *latent), dtype=np.float32),
                "timestep": np.full((2,), 500, dtype=time_dtype),
                "encoder_hidden_states": context,
            }
        else:
            (key,) = _input_names(layout.graphs[name])
            sample = rng.standard_normal((1, spec.latent_channels, *latent), dtype=np.float32)
            feeds = {key: sample / np.float32(spec.scaling_factor)}
        say(0.05 + 0.2 * index, f"converting {name}")
        fp32 = convert(
            layout.graphs[name], reference / spec.graphs[name], limits=limits, selftest_inputs=feeds
        )
        entry: dict[str, Any] = {
            "nodes_before": fp32.nodes_before,
            "nodes_after": fp32.nodes_after,
            "fp32_size": fp32.package_size,
        }
        if converted != reference:
            say(0.15 + 0.2 * index, f"converting {name} to {options.weights}")
            report = convert(
                layout.graphs[name],
                converted / spec.graphs[name],
                quantize=options.weights,
                calibration=feeds,
                limits=limits,
                selftest_inputs=feeds,
            )
            entry |= {"size": report.package_size, "accuracy": report.accuracy}
            entry["size_ratio"] = round(report.package_size / fp32.package_size, 4)
        reports[name] = entry
        if name == "text_encoder":
            outputs = Session(reference / spec.graphs[name], threads=options.threads).run(feeds)
            context = outputs.get("last_hidden_state", next(iter(outputs.values())))
    return reports


def _input_names(path: Path) -> list[str]:
    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in inits]


def _pipeline_accuracy(reference: Path, converted: Path, options: DiffusionOptions) -> dict[str, Any]:
    request = GenerationRequest(
        ACCURACY_PROMPT, steps=options.accuracy_steps, seed=ACCURACY_SEED, scheduler=options.scheduler
    )
    fp32 = DiffusionPipeline(reference, threads=options.threads).generate(request)
    ours = DiffusionPipeline(converted, threads=options.threads).generate(request)
    return {
        "prompt": ACCURACY_PROMPT,
        "seed": ACCURACY_SEED,
        "steps": options.accuracy_steps,
        "size": options.size,
        "scheduler": options.scheduler,
        "psnr_db": round(psnr(ours.image, fp32.image), 3),
        "ssim": round(ssim(ours.image, fp32.image), 5),
    }


def _selftest_request(selftest: SelfTest) -> GenerationRequest:
    return GenerationRequest(
        selftest.prompt,
        width=selftest.size,
        height=selftest.size,
        steps=selftest.steps,
        guidance_scale=selftest.guidance_scale,
        seed=selftest.seed,
        scheduler=selftest.scheduler,
    )


def _write_package(
    directory: Path,
    dst: Path,
    spec: DiffusionSpec,
    report: DiffusionConversionReport,
    sign_key: bytes | None,
    claims: SignedClaims | None,
) -> list[str]:
    names = [SPEC, TOKENIZER, SCHEDULER, ACCURACY, SELFTEST_IMAGE, *spec.graphs.values()]
    files = [
        {"path": n, "sha256": file_sha256(directory / n), "size": (directory / n).stat().st_size}
        for n in names
    ]
    metadata = {
        "kind": KIND,
        "converter_version": CONVERTER_VERSION,
        "diffusion": {
            "precision": spec.precision,
            "default_size": spec.default_size,
            "min_size": spec.min_size,
            "max_size": spec.max_size,
            "size_multiple": spec.size_multiple,
            "scheduler": spec.scheduler,
            "report": report.stored(),
        },
    }
    manifest = Manifest(
        inputs=[{"name": "prompt", "dtype": "string", "shape": []}],
        outputs=[{"name": "image", "dtype": "uint8", "shape": ["height", "width", 3]}],
        files=files,
        metadata=metadata,
        graph=SPEC,
        weights=spec.graphs["unet"],
    ).to_bytes()
    unsigned = dst.with_name(dst.name + ".unsigned") if sign_key is not None else dst
    handles = [open(directory / n, "rb") for n in names]  # noqa: SIM115 - closed below
    try:
        entries = [(MANIFEST, len(manifest), io.BytesIO(manifest))]
        entries += [(n, f["size"], h) for n, f, h in zip(names, files, handles, strict=True)]
        write_entries(unsigned, entries)
        if sign_key is not None:
            sign_package(unsigned, dst, sign_key, claims or SignedClaims())
    except OSError as exc:
        raise ConversionError(f"{dst}: cannot write the package ({exc.strerror or exc})") from exc
    finally:
        for handle in handles:
            handle.close()
        Path(str(dst) + ".tmp").unlink(missing_ok=True)
        if unsigned != dst:
            unsigned.unlink(missing_ok=True)
            Path(str(unsigned) + ".tmp").unlink(missing_ok=True)
    return names
