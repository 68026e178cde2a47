"""Run one pass on a translated model and compare the engine with onnxruntime on the original."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from converter import optimize
from converter.translate import translate
from engine import Session
from tests.model_packages import write_package

RNG = np.random.default_rng(7)


def const(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check_pass(tmp_path, source: onnx.ModelProto, step, feeds: dict[str, np.ndarray]):
    """Apply one pass to the translated model; compare the engine's result with onnxruntime's."""
    inferred = onnx.shape_inference.infer_shapes(source, strict_mode=True)
    graph = step(optimize.drop_pass_through(translate(inferred, source.opset_import[0].version)))
    path = tmp_path / f"{step.__name__}.ferry"
    write_package(
        path,
        graph=graph.graph_dict(),
        tensors=graph.tensors,
        inputs=graph.inputs,
        outputs=graph.outputs,
    )
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = Session(path, threads=1).run(feeds)
    for spec, expected in zip(graph.outputs, want, strict=True):
        np.testing.assert_allclose(got[spec["name"]], expected, rtol=1e-4, atol=1e-5)
    return graph


def ops(graph) -> list[str]:
    return [node["op"] for node in graph.nodes]
