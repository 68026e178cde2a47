"""The operators added for diffusion graphs against onnxruntime: GroupNormalization (engine/ops/
group_norm.py, opset 21: per-channel scale and bias; opset 18's per-group form is refused by the ONNX
checker before the engine) and Trilu (engine/ops/trilu.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converter import convert
from converter.errors import UnsupportedOperatorsError
from engine import Session


def model(opset: int, shape: tuple[int, ...], groups: int, eps: float, **attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(opset + groups)
    width = shape[1]
    inits = [
        numpy_helper.from_array((1 + 0.3 * rng.standard_normal(width)).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "bias"),
    ]
    node = helper.make_node(
        "GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=groups, epsilon=eps, **attrs
    )
    dims = ["n", shape[1], *[f"d{i}" for i in range(len(shape) - 2)]]
    graph = helper.make_graph(
        [node],
        "gn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("opset", [21, 23])
@pytest.mark.parametrize(
    "shape, groups, eps",
    [((2, 8, 5, 7), 4, 1e-5), ((1, 12, 9), 3, 1e-6), ((3, 6, 4, 4), 6, 1e-5), ((1, 32, 16, 16), 32, 1e-5)],
)
def test_matches_onnxruntime(
    tmp_path: Path, opset: int, shape: tuple[int, ...], groups: int, eps: float
) -> None:
    source = model(opset, shape, groups, eps)
    x = (np.random.default_rng(1).standard_normal(shape) * 3 + 1).astype(np.float32)
    convert(source, tmp_path / "gn.ferry", selftest_inputs={"x": x})
    expected = ort.InferenceSession(source.SerializeToString()).run(None, {"x": x})[0]
    session = Session(tmp_path / "gn.ferry")
    for _ in range(3):  # recorded, planned, then the plan's run
        np.testing.assert_allclose(session.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)


def test_other_stash_types_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedOperatorsError, match="stash_type"):
        convert(model(21, (1, 4, 2, 2), 2, 1e-5, stash_type=0), tmp_path / "gn.ferry")


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 0, 2])
def test_trilu_matches_onnxruntime(tmp_path: Path, upper: int, k: int | None) -> None:
    """Trilu (engine/ops/trilu.py): the causal masks torch exports for CLIP's attention."""
    inputs = ["x"] if k is None else ["x", "k"]
    inits = [] if k is None else [numpy_helper.from_array(np.array(k, np.int64), "k")]
    graph = helper.make_graph(
        [helper.make_node("Trilu", inputs, ["y"], upper=upper)],
        "trilu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 7])],
        inits,
    )
    source = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = np.random.default_rng(2).standard_normal((2, 5, 7)).astype(np.float32)
    convert(source, tmp_path / "t.ferry")
    expected = ort.InferenceSession(source.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(Session(tmp_path / "t.ferry").run({"x": x})["y"], expected)
