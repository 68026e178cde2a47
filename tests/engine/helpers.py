"""Run one ONNX graph on the Ferry engine and on onnx's ReferenceEvaluator, and compare."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from converter.translate import node_dict
from engine import Session
from engine.search import with_packed
from tests.model_packages import write_package


def single_node_model(
    op: str,
    inputs: list[np.ndarray | None],
    attrs: dict | None = None,
    *,
    n_outputs: int = 1,
    opset: int = 17,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A graph of one node whose inputs are all graph inputs (None = omitted optional input)."""
    names = ["" if value is None else f"in{i}" for i, value in enumerate(inputs)]
    outputs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outputs, name=f"the_{op.lower()}", **(attrs or {}))
    feeds = {name: value for name, value in zip(names, inputs, strict=True) if name}
    graph = helper.make_graph(
        [node],
        "single",
        [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for name, v in feeds.items()
        ],
        [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


def write_model_package(model: onnx.ModelProto, path: Path, feeds: dict[str, np.ndarray]) -> Path:
    """A package straight from an ONNX graph (no converter checks), inputs shaped like ``feeds``."""
    graph = model.graph
    tensors = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    write_package(
        path,
        graph={
            "nodes": [
                node_dict(node, node.name or f"{node.op_type}_{i}") for i, node in enumerate(graph.node)
            ],
            "inputs": list(feeds),
            "outputs": [o.name for o in graph.output],
            "opset": opset,
        },
        tensors=tensors,
        inputs=[{"name": k, "dtype": v.dtype.name, "shape": list(v.shape)} for k, v in feeds.items()],
        outputs=[{"name": o.name, "dtype": "float32", "shape": None} for o in graph.output],
    )
    return path


def run_engine(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(write_model_package(model, Path(tmp) / "m.ferry", feeds), threads=1)
        first = session.run(feeds)  # node by node, recording the plan
        results = session.run(feeds)  # the planned run: folded, fused, in place
    for name, value in first.items():
        message = f"planned run differs on {name}"
        if value.dtype.kind != "f":
            np.testing.assert_array_equal(results[name], value, err_msg=message)
            continue
        # the plan may run a kernel the search measured faster (Winograd, a GEMM with the bias
        # folded in): the same result up to float rounding, not bit for bit
        atol = 1e-5 * max(1.0, float(np.max(np.abs(value), initial=0.0)))
        np.testing.assert_allclose(results[name], value, rtol=1e-5, atol=atol, err_msg=message)
    return [results[o.name] for o in model.graph.output]


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def run_onnxruntime(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], output_type: int = TensorProto.FLOAT
) -> list[np.ndarray]:
    """For the few cases where the reference evaluator is wrong or cannot run (noted at each use).
    onnxruntime needs typed outputs: those the model leaves undefined get ``output_type``."""
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for output in model.graph.output:
        if output.type.tensor_type.elem_type == TensorProto.UNDEFINED:
            output.type.tensor_type.elem_type = output_type
    model.ir_version = min(model.ir_version, 8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_same(got: list[np.ndarray], want: list[np.ndarray], rtol: float, atol: float) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, f"output {i}: shape {g.shape} != reference {w.shape}"
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype} != reference {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i}")


def check_op(
    op: str,
    inputs: list[np.ndarray | None],
    attrs: dict | None = None,
    *,
    n_outputs: int = 1,
    opset: int = 17,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> list[np.ndarray]:
    """Assert the engine and the ONNX reference agree on one node; return the engine's outputs."""
    model, feeds = single_node_model(op, inputs, attrs, n_outputs=n_outputs, opset=opset)
    got = run_engine(model, feeds)
    assert_same(got, run_reference(model, feeds), rtol, atol)
    return got


def run_int8_matmul_reference(
    q: np.ndarray, scale: np.ndarray, a: np.ndarray, bias: np.ndarray | None, activation: str | None = None
) -> np.ndarray:
    """DequantizeLinear(q, scale per column) -> MatMul(a, .) [-> Add(bias)] [-> activation],
    the int8 matmul as ONNX spells it, run by onnx's ReferenceEvaluator."""
    nodes = [helper.make_node("DequantizeLinear", ["q", "scale"], ["w"], axis=1)]
    initializers = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "scale")]
    value = "h"
    nodes.append(helper.make_node("MatMul", ["a", "w"], [value]))
    if bias is not None:
        nodes.append(helper.make_node("Add", [value, "bias"], ["hb"]))
        initializers.append(numpy_helper.from_array(bias, "bias"))
        value = "hb"
    if activation is not None:
        nodes.append(helper.make_node(activation, [value], ["act"]))
        value = "act"
    graph = helper.make_graph(
        nodes,
        "int8_matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape))],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, None)],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return ReferenceEvaluator(model).run(None, {"a": a})[0]


def laid_out(x: np.ndarray, layout: str) -> np.ndarray:
    """``x`` (NCHW) as a kernel may meet it: "channels_last" (a transposed view of NHWC memory),
    "strided" (every other element of a wider array), or as it is."""
    if layout == "channels_last":
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    if layout == "strided":
        wide = np.zeros((*x.shape[:3], 2 * x.shape[3]), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x


def fused_conv_reference(x, w, b, residual, attrs: dict, activation: str | None) -> np.ndarray:  # noqa: ANN001
    """onnx's reference Conv, plus the residual, then the activation: what a FusedConv means."""
    plain = {k: v for k, v in attrs.items() if k not in ("activation", "activation_attrs")}
    model, feeds = single_node_model("Conv", [x, w, b], plain)
    (want,) = run_reference(model, feeds)
    if residual is not None:
        want = want + residual
    if activation == "Relu":
        want = np.maximum(want, 0)
    elif activation == "Clip":
        want = np.clip(want, 0.0, 6.0)
    return want


def assert_candidates_match(
    candidates: list, inputs: list[np.ndarray | None], attrs: dict, want: np.ndarray, atol: float
) -> None:
    """Every kernel candidate, its weights pre-packed the way a plan packs them, gives ``want``."""
    for kernel in candidates:
        got = kernel(with_packed(kernel, inputs, attrs), attrs)[0]
        assert got.shape == want.shape, kernel.__name__
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=kernel.__name__)
