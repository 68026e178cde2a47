"""Every registered operator against onnx.reference.ReferenceEvaluator on fixed random inputs.

The hypothesis suites (test_ops_properties.py) go wider on the ops with many attributes;
this table makes sure nothing in the registry goes untested.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from engine.errors import NodeExecutionError
from engine.ops import REGISTRY, supported_operators
from engine.ops.geglu import INTERNAL_OPS as GEGLU_INTERNAL_OPS
from engine.ops.group_norm import INTERNAL_OPS as GROUP_NORM_INTERNAL_OPS
from engine.ops.qdq_conv import INTERNAL_OPS as QDQ_CONV_INTERNAL_OPS
from engine.ops.qdq_matmul import INTERNAL_OPS as QDQ_INTERNAL_OPS
from tests.engine.helpers import assert_same, check_op, run_engine, run_onnxruntime, single_node_model

rng = np.random.default_rng(7)


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def positive(*shape: int) -> np.ndarray:
    return (np.abs(f32(*shape)) + 0.1).astype(np.float32)


def ints(*shape: int) -> np.ndarray:
    return rng.integers(-9, 10, size=shape).astype(np.int64)


def nonzero_ints(*shape: int) -> np.ndarray:
    v = ints(*shape)
    return np.where(v == 0, 3, v)


def bools(*shape: int) -> np.ndarray:
    return rng.random(shape) < 0.5


WIDE = np.concatenate([f32(3, 4), np.array([[-60, -20, 20, 60]], dtype=np.float32)])

# (id, op, inputs, attrs, extra keyword arguments for check_op)
CASES = [
    # pointwise math
    ("abs", "Abs", [f32(3, 4)], {}, {}),
    ("neg", "Neg", [f32(3, 4)], {}, {}),
    ("sqrt", "Sqrt", [positive(3, 4)], {}, {}),
    ("exp", "Exp", [f32(3, 4)], {}, {}),
    ("log", "Log", [positive(3, 4)], {}, {}),
    ("reciprocal", "Reciprocal", [positive(3, 4)], {}, {}),
    ("floor", "Floor", [f32(3, 4, scale=3)], {}, {}),
    ("ceil", "Ceil", [f32(3, 4, scale=3)], {}, {}),
    ("round", "Round", [np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4], np.float32)], {}, {}),
    ("sign", "Sign", [np.array([-2, 0, 3], np.float32)], {}, {}),
    ("sin", "Sin", [f32(5)], {}, {}),
    ("cos", "Cos", [f32(5)], {}, {}),
    ("erf", "Erf", [f32(4, 5, scale=2)], {}, {"atol": 2e-7}),
    ("not", "Not", [bools(4, 3)], {}, {}),
    # activations
    ("relu", "Relu", [f32(2, 3, 4)], {}, {}),
    ("leaky_relu", "LeakyRelu", [f32(2, 3, 4)], {"alpha": 0.1}, {}),
    ("leaky_relu_default", "LeakyRelu", [f32(2, 3, 4)], {}, {}),
    ("elu", "Elu", [f32(3, 4)], {"alpha": 0.7}, {}),
    ("sigmoid", "Sigmoid", [WIDE], {}, {}),
    ("tanh", "Tanh", [WIDE], {}, {}),
    ("softplus", "Softplus", [WIDE], {}, {}),
    ("hard_sigmoid", "HardSigmoid", [f32(3, 4, scale=4)], {"alpha": 0.3, "beta": 0.4}, {}),
    ("hard_sigmoid_default", "HardSigmoid", [f32(3, 4, scale=4)], {}, {}),
    ("hard_swish", "HardSwish", [f32(3, 4, scale=4)], {}, {}),
    ("gelu", "Gelu", [f32(3, 4, scale=2)], {}, {"opset": 20}),
    ("gelu_tanh", "Gelu", [f32(3, 4, scale=2)], {"approximate": "tanh"}, {"opset": 20}),
    ("clip_both", "Clip", [f32(3, 4), np.array(-0.5, np.float32), np.array(0.5, np.float32)], {}, {}),
    ("clip_min_only", "Clip", [f32(3, 4), np.array(0.0, np.float32)], {}, {}),
    ("clip_max_only", "Clip", [f32(3, 4), None, np.array(0.2, np.float32)], {}, {}),
    ("clip_none", "Clip", [f32(3, 4)], {}, {}),
    # arithmetic and comparisons
    ("add", "Add", [f32(2, 3, 4), f32(3, 1)], {}, {}),
    ("sub", "Sub", [f32(2, 3, 4), f32(4)], {}, {}),
    ("mul", "Mul", [f32(3, 1), f32(1, 4)], {}, {}),
    ("div", "Div", [f32(3, 4), positive(4)], {}, {}),
    ("div_int_truncates", "Div", [ints(4, 5), nonzero_ints(5)], {}, {}),
    ("pow", "Pow", [positive(3, 4), f32(4)], {}, {}),
    ("pow_int_exponent", "Pow", [f32(3, 4), i64(2)], {}, {}),
    ("equal", "Equal", [ints(3, 4), ints(4)], {}, {}),
    ("less", "Less", [f32(3, 4), f32(4)], {}, {}),
    ("less_or_equal", "LessOrEqual", [ints(3, 4), ints(3, 1)], {}, {}),
    ("greater", "Greater", [f32(3, 4), f32(1)], {}, {}),
    ("greater_or_equal", "GreaterOrEqual", [ints(3, 4), ints(4)], {}, {}),
    ("and", "And", [bools(3, 4), bools(4)], {}, {}),
    ("or", "Or", [bools(3, 4), bools(3, 1)], {}, {}),
    ("xor", "Xor", [bools(3, 4), bools(4)], {}, {}),
    ("max", "Max", [f32(3, 4), f32(4), f32(3, 1)], {}, {}),
    ("min", "Min", [f32(3, 4), f32(4), f32(3, 1)], {}, {}),
    ("sum", "Sum", [f32(3, 4), f32(4), f32(3, 1)], {}, {}),
    ("mean", "Mean", [f32(3, 4), f32(4), f32(3, 1)], {}, {}),
    ("where", "Where", [bools(3, 4), f32(3, 4), f32(4)], {}, {}),
    ("cast_to_int32", "Cast", [f32(3, 4, scale=5)], {"to": 6}, {}),
    ("cast_to_float16", "Cast", [f32(3, 4)], {"to": 10}, {}),
    ("cast_like", "CastLike", [ints(3, 4), f32(1)], {}, {}),
    # pooling, normalisation
    (
        "max_pool",
        "MaxPool",
        [f32(2, 3, 6, 5)],
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]},
        {},
    ),
    (
        "max_pool_same_upper",
        "MaxPool",
        [f32(1, 2, 5, 5)],
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
        {},
    ),
    (
        "average_pool_exclude_pad",
        "AveragePool",
        [f32(2, 3, 6, 5)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {},
    ),
    (
        "average_pool_include_pad",
        "AveragePool",
        [f32(2, 3, 6, 5)],
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "count_include_pad": 1},
        {},
    ),
    (
        "average_pool_valid",
        "AveragePool",
        [f32(1, 2, 7, 7)],
        {"kernel_shape": [2, 2], "strides": [3, 3], "auto_pad": "VALID"},
        {},
    ),
    (
        "conv",
        "Conv",
        [f32(2, 4, 7, 6), f32(6, 2, 3, 3), f32(6)],
        {"group": 2, "pads": [1, 1, 0, 2], "strides": [2, 1]},
        {"rtol": 1e-4, "atol": 1e-4},
    ),
    (
        "conv_1x1",
        "Conv",
        [f32(2, 4, 5, 5), f32(3, 4, 1, 1)],
        {"strides": [2, 2]},
        {"rtol": 1e-4, "atol": 1e-4},
    ),
    (
        "conv_depthwise",
        "Conv",
        [f32(1, 3, 6, 6), f32(6, 1, 3, 3), f32(6)],
        {"group": 3, "auto_pad": "SAME_UPPER"},
        {"rtol": 1e-4, "atol": 1e-4},
    ),
    ("slice", "Slice", [f32(4, 5, 6), i64(1, -4), i64(100, -1), i64(0, 2), i64(1, 2)], {}, {}),
    ("slice_negative_step", "Slice", [f32(4, 5), i64(-1), i64(-100), i64(1), i64(-2)], {}, {}),
    ("global_average_pool", "GlobalAveragePool", [f32(2, 3, 5, 4)], {}, {}),
    ("global_max_pool", "GlobalMaxPool", [f32(2, 3, 5, 4)], {}, {}),
    (
        "batch_norm",
        "BatchNormalization",
        [f32(2, 3, 4, 5), f32(3), f32(3), f32(3), positive(3)],
        {"epsilon": 1e-3},
        {},
    ),
    ("instance_norm", "InstanceNormalization", [f32(2, 3, 4, 5), f32(3), f32(3)], {}, {}),
    ("layer_norm", "LayerNormalization", [f32(2, 3, 8), f32(8), f32(8)], {}, {}),
    ("group_norm", "GroupNormalization", [f32(2, 6, 4, 4), f32(6), f32(6)], {"num_groups": 3}, {"opset": 21}),
    ("trilu_upper", "Trilu", [f32(4, 5)], {}, {}),
    ("trilu_lower_k", "Trilu", [f32(2, 4, 5), np.array(1, np.int64)], {"upper": 0}, {}),
    (
        "layer_norm_axis1_all_outputs",
        "LayerNormalization",
        [f32(2, 3, 4), f32(3, 4), None],
        {"axis": 1, "epsilon": 1e-3},
        {"n_outputs": 3},
    ),
    ("gemm", "Gemm", [f32(3, 4), f32(5, 4), f32(5)], {"transB": 1, "alpha": 0.5, "beta": 2.0}, {}),
    ("matmul_batched", "MatMul", [f32(2, 1, 3, 4), f32(5, 4, 2)], {}, {}),
    ("matmul_vector", "MatMul", [f32(4), f32(2, 4, 3)], {}, {}),
    ("softmax", "Softmax", [f32(2, 3, 4)], {"axis": 1}, {}),
    ("log_softmax", "LogSoftmax", [f32(2, 3, 4)], {}, {}),
    # shapes and indexing
    ("identity", "Identity", [f32(2, 3)], {}, {}),
    ("dropout_with_mask", "Dropout", [f32(2, 3)], {}, {"n_outputs": 2}),
    ("reshape_zero_and_minus_one", "Reshape", [f32(2, 3, 4), i64(0, -1)], {}, {}),
    ("reshape_allowzero", "Reshape", [f32(0, 3), i64(3, 0)], {"allowzero": 1}, {}),
    ("flatten_axis0", "Flatten", [f32(2, 3, 4)], {"axis": 0}, {}),
    ("flatten_axis_neg", "Flatten", [f32(2, 3, 4)], {"axis": -1}, {}),
    ("transpose_default", "Transpose", [f32(2, 3, 4)], {}, {}),
    ("concat", "Concat", [f32(2, 3), f32(2, 1), f32(2, 0)], {"axis": -1}, {}),
    ("squeeze_axes", "Squeeze", [f32(1, 3, 1, 2), i64(-2)], {}, {}),
    ("squeeze_all", "Squeeze", [f32(1, 3, 1, 2)], {}, {}),
    ("squeeze_opset11_attr", "Squeeze", [f32(1, 3, 1, 2)], {"axes": [0]}, {"opset": 11}),
    ("unsqueeze", "Unsqueeze", [f32(3, 2), i64(0, -1)], {}, {}),
    ("unsqueeze_opset11_attr", "Unsqueeze", [f32(3, 2)], {"axes": [1]}, {"opset": 11}),
    ("shape", "Shape", [f32(2, 3, 4)], {}, {}),
    ("shape_start_end", "Shape", [f32(2, 3, 4, 5)], {"start": 1, "end": -1}, {"opset": 15}),
    ("size", "Size", [f32(2, 3, 4)], {}, {}),
    ("gather_axis0", "Gather", [f32(5, 3), i64(0, -1, 2)], {}, {}),
    ("gather_axis1_2d", "Gather", [f32(2, 5, 3), np.array([[1, -2], [4, 0]], np.int64)], {"axis": 1}, {}),
    ("split_sizes", "Split", [f32(2, 7), i64(3, 4)], {"axis": 1}, {"n_outputs": 2}),
    ("split_even", "Split", [f32(6, 2)], {}, {"n_outputs": 3}),
    ("split_num_outputs", "Split", [f32(7, 2)], {"num_outputs": 3}, {"n_outputs": 3, "opset": 18}),
    ("split_opset11_attr", "Split", [f32(2, 5)], {"axis": 1, "split": [1, 4]}, {"n_outputs": 2, "opset": 11}),
    ("expand", "Expand", [f32(3, 1), i64(2, 1, 4)], {}, {}),
    ("tile", "Tile", [f32(2, 3), i64(2, 1)], {}, {}),
    ("constant_of_shape_default", "ConstantOfShape", [i64(2, 3)], {}, {}),
    ("range", "Range", [np.array(1, np.int64), np.array(10, np.int64), np.array(3, np.int64)], {}, {}),
    (
        "range_float",
        "Range",
        [np.array(1, np.float32), np.array(-2, np.float32), np.array(-0.5, np.float32)],
        {},
        {},
    ),
    ("pad_constant", "Pad", [f32(2, 3), i64(1, 0, 2, 1), np.array(1.5, np.float32)], {}, {}),
    ("pad_reflect", "Pad", [f32(3, 4), i64(1, 2, 1, 2)], {"mode": "reflect"}, {}),
    ("pad_edge", "Pad", [f32(3, 4), i64(0, 2, 1, 0)], {"mode": "edge"}, {}),
    ("pad_axes", "Pad", [f32(2, 3, 4), i64(1, 2), None, i64(-1)], {}, {"opset": 18}),
    # reductions
    ("reduce_mean_axes_input", "ReduceMean", [f32(2, 3, 4), i64(1, -1)], {}, {"opset": 18}),
    ("reduce_mean_attr_axes", "ReduceMean", [f32(2, 3, 4)], {"axes": [0], "keepdims": 0}, {"opset": 13}),
    ("reduce_sum_all", "ReduceSum", [f32(2, 3, 4)], {"keepdims": 0}, {}),
    ("reduce_sum_noop", "ReduceSum", [f32(2, 3)], {"noop_with_empty_axes": 1}, {}),
    ("reduce_sum_axes", "ReduceSum", [f32(2, 3, 4), i64(1)], {}, {}),
    ("reduce_max", "ReduceMax", [f32(2, 3, 4), i64(2)], {}, {"opset": 18}),
    ("reduce_min", "ReduceMin", [f32(2, 3, 4)], {"axes": [0, 2]}, {"opset": 13}),
    ("reduce_prod", "ReduceProd", [f32(2, 3, 4)], {"axes": [1]}, {"opset": 13}),
    ("reduce_sum_square", "ReduceSumSquare", [f32(2, 3, 4)], {"axes": [1], "keepdims": 0}, {"opset": 13}),
    ("reduce_l2", "ReduceL2", [f32(2, 3, 4)], {"axes": [2]}, {"opset": 13}),
    ("argmax", "ArgMax", [f32(3, 4, 5)], {"axis": 1}, {}),
    (
        "argmax_last_index",
        "ArgMax",
        [np.array([[1, 3, 3], [2, 2, 0]], np.float32)],
        {"axis": 1, "select_last_index": 1},
        {},
    ),
    ("argmin", "ArgMin", [f32(3, 4)], {"axis": -1, "keepdims": 0}, {}),
    (
        "conv_transpose",
        "ConvTranspose",
        [f32(1, 3, 5, 5), f32(3, 2, 4, 4), f32(2)],
        {"strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"rtol": 1e-4, "atol": 1e-5},
    ),
    (
        "resize_linear",
        "Resize",
        [f32(1, 2, 3, 4), None, np.array([1, 1, 2, 1.5], np.float32)],
        {"mode": "linear"},
        {},
    ),
    ("topk", "TopK", [f32(3, 7), i64(3)], {}, {"n_outputs": 2}),
    # more edge values in tests/engine/test_dynamic_quantize.py
    ("dynamic_quantize_linear", "DynamicQuantizeLinear", [f32(3, 5)], {}, {"n_outputs": 3}),
    ("topk_k_attribute", "TopK", [f32(3, 7)], {"k": 2, "axis": 0}, {"n_outputs": 2, "opset": 1}),
]


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_matches_reference(op, inputs, attrs, options):
    check_op(op, inputs, attrs, **options)


def test_constant_of_shape_value():
    value = {"value": helper.make_tensor("v", TensorProto.INT64, [1], [42])}
    check_op("ConstantOfShape", [i64(2, 2)], value)


@pytest.mark.parametrize(("op", "attrs"), [("Softmax", {"axis": 1}), ("LogSoftmax", {})])
def test_softmax_before_opset_13_flattens_to_2d(op, attrs):
    """Against onnxruntime: the reference evaluator gives opset-11 Softmax the opset-13 meaning."""
    model, feeds = single_node_model(op, [f32(2, 3, 4)], attrs, opset=11)
    assert_same(run_engine(model, feeds), run_onnxruntime(model, feeds), rtol=1e-5, atol=1e-6)


def test_pad_negative_pads_crop():
    """Against onnxruntime: the reference evaluator rejects negative pads."""
    model, feeds = single_node_model("Pad", [f32(3, 4), i64(-1, 1, 0, -2), np.array(2.0, np.float32)])
    got = run_engine(model, feeds)
    assert got[0].shape == (2, 3)
    assert_same(got, run_onnxruntime(model, feeds), rtol=0, atol=0)


# Kernels of the converter's fused, quantized and Raster forms are tested with the converter.
ELSEWHERE = ("engine.ops.fused", "engine.ops.quantized", "engine.ops.raster")
# other converter-written ops, tested against onnxruntime elsewhere (FusedGroupNorm:
# tests/engine/diffusion/test_group_norm_silu.py; FusedGeglu: tests/engine/diffusion/test_geglu.py;
# the planner's QdqMatMul and QdqConv: tests/engine/test_int8_activations.py)
INTERNAL_ELSEWHERE = GROUP_NORM_INTERNAL_OPS | GEGLU_INTERNAL_OPS | QDQ_INTERNAL_OPS | QDQ_CONV_INTERNAL_OPS


def test_every_registered_op_is_covered():
    covered = {case[1] for case in CASES}
    ours = {op for op in supported_operators() if REGISTRY[op].__module__ not in ELSEWHERE}
    assert ours - INTERNAL_ELSEWHERE <= covered, ours - INTERNAL_ELSEWHERE - covered


def test_top_k_agrees_with_onnxruntime_on_ties():
    """The spec's tie rule (lower index first), checked against the runtime users compare with."""
    x = np.array([[2, 5, 5, 1, 5, 2]], np.float32)
    for largest in (0, 1):
        model, feeds = single_node_model("TopK", [x, i64(4)], {"largest": largest}, n_outputs=2)
        got = run_engine(model, feeds)
        model.graph.output[1].type.tensor_type.elem_type = TensorProto.INT64
        want = run_onnxruntime(model, feeds)  # output 0 made float, output 1 stays int64
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize(
    ("k", "message"), [(i64(8), "k=8 is outside 0..7"), (i64(1, 2), "K must be one integer")]
)
def test_top_k_bad_k_is_named(k, message):
    model, feeds = single_node_model("TopK", [f32(2, 7), k], n_outputs=2)
    with pytest.raises(NodeExecutionError, match=message):
        run_engine(model, feeds)
