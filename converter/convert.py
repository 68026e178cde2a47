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

from converter import accuracy, calibrate, optimize, selftest, validate
from converter import quantize as quant
from converter.errors import ConversionError
from converter.limits import Limits
from converter.load import LoadedModel, Source, load_model
from converter.options import ConversionOptions, InvalidOptionsError
from converter.translate import FerryGraph, translate
from deploy.package import write_package
from engine import supported_operators
from engine.format import write_model_files
from engine.ops.fused import INTERNAL_OPS as FUSED_OPS
from engine.ops.geglu import INTERNAL_OPS as GEGLU_OPS
from engine.ops.group_norm import INTERNAL_OPS as GROUP_NORM_OPS
from engine.ops.quantized import INTERNAL_OPS as QUANTIZED_OPS
from engine.ops.raster import INTERNAL_OPS as RASTER_OPS

CONVERTER_VERSION = "0.2.0"
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
    block_size: int | None = None
    quantized_weights: list[str] = field(default_factory=list)
    float_layers: list[str] = field(default_factory=list)
    activations: str | None = None  # int8 activations: the calibration method, or "dynamic"
    activation_ranges: dict[str, list[float]] = field(default_factory=dict)  # static ones'
    activation_inputs: list[str] = field(default_factory=list)  # the values quantized (either kind)
    accuracy: dict[str, Any] | None = None
    passes: list[dict[str, Any]] = field(default_factory=list)
    dynamic_inputs: list[str] = field(default_factory=list)
    fp32_package_size: int | None = None  # the float32 graph and weights, no self-test vectors
    converted_size: int | None = None  # the same for the converted graph
    size_ratio: float | None = None  # converted_size / fp32_package_size
    package_size: int | None = None  # the package written, self-test vectors and metadata included

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stored(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_dict().items() if k not in ("source", "package_size")}


def convert(
    src: Source,
    dst: str | os.PathLike[str],
    *,
    options: ConversionOptions | None = None,
    quantize: str | None = None,
    block_size: int = 32,
    calibration: Any = None,
    progress: Progress | None = None,
    keep_float: str | list[str] | None = None,
    accuracy_budget: float | None = None,
    activations: str | None = None,
    limits: Limits | None = None,
    selftest_inputs: dict[str, np.ndarray] | None = None,
) -> ConversionReport:
    """Convert an ONNX model (path or ModelProto) into a Ferry package at ``dst``.

    ``quantize``: None keeps float32 weights; "fp16" stores them as float16; "int8" quantizes
    MatMul/Gemm/Conv/embedding weights symmetrically per output channel; "int4" asymmetrically
    in blocks of ``block_size`` (32, 64 or 128) along the reduction axis, two values per byte.
    The engine computes in float32 throughout.  ``calibration`` (a dict of input arrays, a
    list of them, or an .npz path) supplies the inputs of the accuracy report (default: seeded
    random inputs).  Mixed precision: ``keep_float`` ("first_last" or a list of node names)
    keeps those layers float32; ``accuracy_budget`` (a minimum cosine similarity of every
    output against float32, e.g. 0.999) keeps the layers with the worst quantization error
    float32 until the budget is met.  ``activations`` ("minmax" or "percentile", with
    ``calibration`` and int8/int4 weights) adds post-training static int8 activations: the
    ranges seen on the calibration samples, as QuantizeLinear/DequantizeLinear pairs on the
    input of each quantized layer (see converter.calibrate); "dynamic" (no calibration needed)
    puts DynamicQuantizeLinear/DequantizeLinear pairs there instead, ranges computed per run.
    ``limits`` caps model and tensor sizes (default: from the environment, see
    converter.limits).  ``options`` holds all of these at once (a ConversionOptions, e.g. from
    ``ConversionOptions.from_dict``) instead of the separate arguments; bad options raise
    InvalidOptionsError naming the option.

    The package holds self-test vectors (metadata "selftest") and metadata keys
    source_sha256, source_opset, producer, converter_version, quantize, dynamic_inputs and
    report.  Converting the same model twice gives byte-identical packages.  On any failure
    a ConversionError subclass is raised and nothing is written at ``dst``.
    ``progress(fraction, message)`` is called as each step starts.  ``selftest_inputs`` replaces
    the seeded self-test input (whose dynamic dims are 1) where a model needs real sizes (a UNet's
    latent must survive its downsamplings).
    """
    options = _resolved(
        options,
        quantize=quantize,
        block_size=block_size,
        calibration=calibration,
        keep_float=keep_float,
        accuracy_budget=accuracy_budget,
        activations=activations,
    )
    dst = package_destination(dst)
    say = progress or (lambda fraction, message: None)
    limits = limits or _limits_from_env()

    say(0.0, "loading model")
    loaded = load_model(src, limits)
    say(0.1, "validating")
    model, source_opset = _validated(loaded, limits)

    say(0.3, "optimizing")
    opset = validate.default_opset(model, loaded.label)
    fp32, passes = optimize.optimize(translate(model, opset, loaded.external_dir))
    validate.check_engine_support(fp32.nodes, opset)
    eval_feeds, eval_kind = _evaluation_inputs(options.calibration, fp32, options.quantize)

    with tempfile.TemporaryDirectory(prefix="ferry-convert-") as tmp:
        reference = Path(tmp) / "reference.ferry"
        _write(reference, fp32, {})
        reduced = _Reduced(fp32)
        if options.quantize is not None:
            say(0.45, f"quantizing weights ({options.quantize})")
            reduced = _reduce(fp32, options, eval_feeds, reference, Path(tmp), say)
            reduced.accuracy = {"inputs": eval_kind, "samples": len(eval_feeds), "outputs": reduced.outputs}
        graph = reduced.graph
        report = _report(loaded, model, source_opset, opset, options, reduced)
        report.passes, report.fp32_package_size = passes, reference.stat().st_size
        say(0.75, "writing draft package")
        draft = Path(tmp) / "draft.ferry"
        if options.quantize is None:
            draft = reference  # the same graph: not written (and its weights read) twice
        else:
            _write(draft, graph, {})
        report.converted_size = draft.stat().st_size
        report.size_ratio = round(report.converted_size / report.fp32_package_size, 4)
        say(0.8, "self-testing")
        inputs = selftest_inputs if selftest_inputs is not None else selftest.make_inputs(graph.inputs)
        feeds = selftest.on_grid(inputs)
        outputs = selftest.run(draft, feeds)

    say(0.9, "writing package")
    vectors, selftest_meta = selftest.vectors(feeds, outputs)
    metadata = {
        "source_sha256": loaded.sha256,
        "source_opset": source_opset,
        "producer": report.producer,
        "converter_version": CONVERTER_VERSION,
        "quantize": options.quantize,
        "dynamic_inputs": report.dynamic_inputs,
        "selftest": selftest_meta,
        "report": report.stored(),
    }
    _write(dst, graph, metadata, extra_tensors=vectors)
    report.package_size = dst.stat().st_size
    say(1.0, "done")
    return report


def _evaluation_inputs(
    calibration: Any, graph: FerryGraph, quantize: str | None
) -> tuple[list[accuracy.Feeds], str]:
    """The accuracy report's inputs: the calibration samples (checked even when not quantizing,
    so a bad set fails now), else seeded random ones."""
    if calibration is not None:
        return accuracy.calibration_feeds(calibration, graph.inputs), "calibration"
    if quantize is None:
        return [], "random"
    return accuracy.random_feeds(graph.inputs, selftest.SEED + 1), "random"


def _limits_from_env() -> Limits:
    try:
        return Limits.from_env()
    except ValueError as exc:
        raise ConversionError(str(exc)) from exc


def _resolved(options: ConversionOptions | None, **separate: Any) -> ConversionOptions:
    """The options convert() runs with: ``options``, or one built (and so checked) from the
    separate arguments; both at once would leave it unclear which wins."""
    if options is None:
        return ConversionOptions(**separate)
    defaults = ConversionOptions()
    beside = sorted(k for k, v in separate.items() if _given(v, getattr(defaults, k)))
    if beside:
        raise InvalidOptionsError(beside[0], f"pass {', '.join(beside)} inside options=, not beside it")
    return options


def _given(value: Any, default: Any) -> bool:
    # `is` against a None default: calibration may hold arrays, whose == is elementwise
    return value is not None if default is None else value != default


@dataclass
class _Reduced:
    """The graph at its storage precision, and what reducing it cost."""

    graph: FerryGraph
    kept_fp32: list[str] = field(default_factory=list)
    quantized: list[str] = field(default_factory=list)
    float_layers: list[str] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] | None = None
    activation_ranges: dict[str, list[float]] = field(default_factory=dict)
    activation_inputs: list[str] = field(default_factory=list)


def _reduce(
    fp32: FerryGraph,
    options: ConversionOptions,
    feeds: list[accuracy.Feeds],
    reference: Path,
    tmp: Path,
    say: Progress,
) -> _Reduced:
    """fp16 / int8 / int4 storage (and int8 activations), measured against float32 on ``feeds``."""
    expected = [selftest.run(reference, feed) for feed in feeds]

    def run(graph: FerryGraph, inputs: list[accuracy.Feeds]) -> list[accuracy.Feeds]:
        candidate = tmp / "candidate.ferry"
        _write(candidate, graph, {})
        return [selftest.run(candidate, feed) for feed in inputs]

    def measure(graph: FerryGraph) -> dict[str, Any]:
        return accuracy.compare_outputs(run(graph, feeds), expected)

    if options.quantize == "fp16":
        graph, kept = quant.to_fp16(fp32)
        return _Reduced(graph, kept_fp32=kept, outputs=measure(graph))
    ranges: dict[str, tuple[float, float]] = {}
    dynamic = options.activations == calibrate.DYNAMIC
    if options.activations and not dynamic:
        say(0.47, f"calibrating int8 activations ({options.activations})")
        everything, _ = quant.quantize_weights(fp32, options.quantize, options.block_size)
        ranges = calibrate.observe(
            fp32, calibrate.activation_inputs(everything), feeds, run, options.activations
        )

    def build(keep: set[str]) -> tuple[FerryGraph, list[quant.QuantizedWeight]]:
        graph, weights = quant.quantize_weights(fp32, options.quantize, options.block_size, frozenset(keep))
        if dynamic:
            graph = calibrate.insert_dynamic(graph, calibrate.activation_inputs(graph))
        elif ranges:
            wanted = calibrate.activation_inputs(graph)
            graph = calibrate.insert_qdq(graph, {v: r for v, r in ranges.items() if v in wanted})
        return graph, weights

    keep = _chosen_float_layers(fp32, options.keep_float)
    graph, weights = build(keep)
    outputs = measure(graph)
    budget = options.accuracy_budget
    if budget is not None and accuracy.worst_cosine(outputs) < budget:
        # keep the worst-quantized layers float32: 1, 2, 4, ... of them until the budget holds
        ranked = [w.node for w in sorted(weights, key=lambda w: (-w.relative_error, w.node))]
        count, trial = 1, keep
        while accuracy.worst_cosine(outputs) < budget and count <= len(ranked):
            say(0.5 + 0.2 * count / len(ranked), f"accuracy budget: trying {count} layer(s) in float32")
            trial = keep | set(ranked[:count])
            graph, _ = build(trial)
            outputs = measure(graph)
            count = len(ranked) + 1 if count == len(ranked) else min(count * 2, len(ranked))
        keep = trial
        weights = [w for w in weights if w.node not in keep]
    suffix = "/act_dq"  # insert_qdq's and insert_dynamic's name for the copy layers read
    read = {name for node in graph.nodes for name in node["inputs"]}
    act_inputs = sorted(name[: -len(suffix)] for name in read if name.endswith(suffix))
    return _Reduced(
        graph,
        quantized=[w.tensor for w in weights],
        float_layers=sorted(keep),
        outputs=outputs,
        activation_ranges={v: list(ranges[v]) for v in act_inputs if v in ranges},
        activation_inputs=act_inputs,
    )


def _chosen_float_layers(graph: FerryGraph, keep_float: str | tuple[str, ...] | None) -> set[str]:
    candidates = [graph.nodes[use.node]["name"] for use in quant.quantizable(graph)]
    if keep_float is None:
        return set()
    if keep_float == "first_last":
        return {candidates[0], candidates[-1]} if candidates else set()
    names = {node["name"] for node in graph.nodes}
    unknown = sorted(set(keep_float) - names)
    if unknown:
        raise ConversionError(f"keep_float names nodes the optimized graph does not have: {unknown}")
    return set(keep_float)


def _validated(loaded: LoadedModel, limits: Limits) -> tuple[onnx.ModelProto, int]:
    """The model upgraded to a supported opset, checked, with inferred shapes; and its source opset."""
    source_opset = validate.default_opset(loaded.model, loaded.label)
    validate.check_initializers(loaded.model, loaded.label, limits)
    validate.check_structure(loaded.model, loaded.label)
    # ops only the converter emits are not accepted from a source model
    supported = (
        set(supported_operators()) - FUSED_OPS - GEGLU_OPS - GROUP_NORM_OPS - QUANTIZED_OPS - RASTER_OPS
    )
    validate.check_operators(loaded.model, supported)
    model = validate.upgrade_opset(loaded.model, source_opset, loaded.label)
    validate.check_operators(model, supported)  # an upgrade may introduce ops
    model = validate.check_and_infer(model, loaded.label, loaded.path)
    validate.check_value_sizes(model, loaded.label, limits)
    return model, source_opset


def _report(
    loaded: LoadedModel,
    model: onnx.ModelProto,
    source_opset: int,
    opset: int,
    options: ConversionOptions,
    reduced: _Reduced,
) -> ConversionReport:
    graph = reduced.graph
    report = ConversionReport(
        source=loaded.label,
        source_sha256=loaded.sha256,
        source_size=loaded.size,
        source_opset=source_opset,
        opset=opset,
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        quantize=options.quantize,
        nodes_before=len(loaded.model.graph.node),
        nodes_after=len(graph.nodes),
        inputs=graph.inputs,
        outputs=graph.outputs,
        tensor_count=len(graph.tensors),
        weights_bytes=sum(int(t.nbytes) for t in graph.tensors.values()),
        kept_fp32=reduced.kept_fp32,
        block_size=options.block_size if options.quantize == "int4" else None,
        quantized_weights=reduced.quantized,
        float_layers=reduced.float_layers,
        activations=options.activations,
        activation_ranges=reduced.activation_ranges,
        activation_inputs=reduced.activation_inputs,
        accuracy=reduced.accuracy,
        dynamic_inputs=[s["name"] for s in graph.inputs if any(isinstance(d, str) for d in s["shape"] or [])],
    )
    if options.quantize == "fp16" and reduced.outputs:
        report.fp16_max_abs_error = max(o["max_abs_error"] for o in reduced.outputs.values())
        report.fp16_cosine_similarity = accuracy.worst_cosine(reduced.outputs)
    return report


def package_destination(dst: str | os.PathLike[str]) -> Path:
    """dst as a package file path, refused with a clear error if it cannot be one."""
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
        # weights.bin streamed to a file beside the package, never whole in memory
        with tempfile.TemporaryDirectory(prefix=".ferry-files-", dir=path.parent) as files:
            write_package(
                path,
                files=write_model_files(
                    files, graph=graph.graph_dict(), tensors={**graph.tensors, **(extra_tensors or {})}
                ),
                inputs=graph.inputs,
                outputs=graph.outputs,
                metadata=metadata,
            )
    except OSError as exc:
        Path(str(path) + ".tmp").unlink(missing_ok=True)
        raise ConversionError(f"{path}: cannot write the package ({exc.strerror or exc})") from exc
