"""convert(): ONNX model in, Ferry package out, with a report of what happened."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from converter import optimize, selftest, validate
from converter import quantize as quant
from converter.errors import ConversionError
from converter.load import LoadedModel, Source, load_model
from converter.translate import FerryGraph, translate
from engine import supported_operators
from engine.format import write_package

CONVERTER_VERSION = "0.1.0"
Progress = Callable[[float, str], None]


@dataclass
class ConversionReport:
    """What convert() did.  ``package_size`` is only known once written, so the copy stored
    in the package's metadata leaves it (and the machine-specific ``source`` path) out."""

    source: str
    source_sha256: str
    source_size: int
    source_opset: int
    opset: int
    producer: str
    quantize: str | None
    nodes_before: int
    nodes_after: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    tensor_count: int
    weights_bytes: int
    fp16_max_abs_error: float | None = None
    fp16_cosine_similarity: float | None = None
    kept_fp32: list[str] = field(default_factory=list)
    package_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stored(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_dict().items() if k not in ("source", "package_size")}


def convert(
    src: Source,
    dst: str | os.PathLike[str],
    *,
    quantize: str | None = None,
    block_size: int = 32,
    calibration: Any = None,
    progress: Progress | None = None,
) -> ConversionReport:
    """Convert an ONNX model (path or ModelProto) into a Ferry package at ``dst``.

    ``quantize``: None keeps float32 weights; "fp16" stores float32 weights as float16
    (halving their size; the engine computes in float32) and reports the accuracy cost.
    "int8" and "int4" raise ConversionError: they are not implemented yet.  ``block_size``
    and ``calibration`` are reserved for those modes and currently unused.

    The package holds self-test vectors (metadata "selftest") and metadata keys
    source_sha256, source_opset, producer, converter_version, quantize and report.
    Converting the same model twice gives byte-identical packages.  On any failure a
    ConversionError subclass is raised and nothing is written at ``dst``.
    ``progress(fraction, message)`` is called as each step starts.
    """
    quant.check_options(quantize, block_size)
    dst = _check_destination(dst)
    say = progress or (lambda fraction, message: None)

    say(0.0, "loading model")
    loaded = load_model(src)
    say(0.1, "validating")
    model, source_opset = _validated(loaded)

    say(0.35, "optimizing")
    opset = validate.default_opset(model, loaded.label)
    fp32 = optimize.optimize(translate(model, opset))
    validate.check_engine_support(fp32.nodes, opset)
    graph, kept = quant.to_fp16(fp32) if quantize == "fp16" else (fp32, [])
    report = _report(loaded, model, graph, source_opset, opset, quantize, kept)

    with tempfile.TemporaryDirectory(prefix="ferry-convert-") as tmp:
        say(0.55, "writing draft package")
        draft = Path(tmp) / "draft.ferry"
        _write(draft, graph, {})
        say(0.7, "self-testing")
        feeds = selftest.make_inputs(graph.inputs)
        outputs = selftest.run(draft, feeds)
        if quantize == "fp16":
            reference = Path(tmp) / "reference.ferry"
            _write(reference, fp32, {})
            error, cosine = selftest.compare(outputs, selftest.run(reference, feeds))
            report.fp16_max_abs_error, report.fp16_cosine_similarity = error, cosine

    say(0.9, "writing package")
    vectors, selftest_meta = selftest.vectors(feeds, outputs)
    metadata = {
        "source_sha256": loaded.sha256,
        "source_opset": source_opset,
        "producer": report.producer,
        "converter_version": CONVERTER_VERSION,
        "quantize": quantize,
        "selftest": selftest_meta,
        "report": report.stored(),
    }
    _write(dst, graph, metadata, extra_tensors=vectors)
    report.package_size = dst.stat().st_size
    say(1.0, "done")
    return report


def _validated(loaded: LoadedModel) -> tuple[onnx.ModelProto, int]:
    """The model upgraded to a supported opset, checked, with inferred shapes; and its source opset."""
    source_opset = validate.default_opset(loaded.model, loaded.label)
    supported = set(supported_operators())
    validate.check_operators(loaded.model, supported)
    model = validate.upgrade_opset(loaded.model, source_opset, loaded.label)
    validate.check_operators(model, supported)  # an upgrade may introduce ops
    return validate.check_and_infer(model, loaded.label), source_opset


def _report(
    loaded: LoadedModel,
    model: onnx.ModelProto,
    graph: FerryGraph,
    source_opset: int,
    opset: int,
    quantize: str | None,
    kept: list[str],
) -> ConversionReport:
    return ConversionReport(
        source=loaded.label,
        source_sha256=loaded.sha256,
        source_size=loaded.size,
        source_opset=source_opset,
        opset=opset,
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        quantize=quantize,
        nodes_before=len(loaded.model.graph.node),
        nodes_after=len(graph.nodes),
        inputs=graph.inputs,
        outputs=graph.outputs,
        tensor_count=len(graph.tensors),
        weights_bytes=sum(int(t.nbytes) for t in graph.tensors.values()),
        kept_fp32=kept,
    )


def _check_destination(dst: str | os.PathLike[str]) -> Path:
    path = Path(dst)
    if path.is_dir():
        raise ConversionError(f"{path}: is a directory; give a file path for the package")
    if not path.parent.is_dir():
        raise ConversionError(f"{path.parent}: no such directory for the package")
    return path


def _write(
    path: Path,
    graph: FerryGraph,
    metadata: dict[str, Any],
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> None:
    try:
        write_package(
            path,
            graph=graph.graph_dict(),
            tensors={**graph.tensors, **(extra_tensors or {})},
            inputs=graph.inputs,
            outputs=graph.outputs,
            metadata=metadata,
        )
    except OSError as exc:
        Path(str(path) + ".tmp").unlink(missing_ok=True)
        raise ConversionError(f"{path}: cannot write the package ({exc.strerror or exc})") from exc
