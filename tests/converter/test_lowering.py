"""converter/lower.py: data movement lowered to Raster nodes (engine/ops/raster.py), checked
against onnxruntime on random inputs.  Data movement is exact, so the results must be equal."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from converter import convert, optimize
from converter.errors import UnsupportedOperatorsError
from converter.lower import lower_data_movement
from converter.samples import build_image_classifier
from converter.translate import translate
from engine import Session
from engine.format import read_package
from engine.ops import CHECKS, REGISTRY
from tests.converter.models import model
from tests.engine.test_models import D, attention_block
from tests.model_packages import write_package

SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
DTYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32}

dims = st.lists(st.integers(1, 4), min_size=1, max_size=4)


def value(name: str, dtype: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, DTYPES[dtype], shape)


def ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def random_input(shape, dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(-100, 100, size=shape).astype(dtype)


def lowered(source: onnx.ModelProto, keep_views: bool = True):
    inferred = onnx.shape_inference.infer_shapes(source, strict_mode=True)
    return lower_data_movement(translate(inferred, source.opset_import[0].version), keep_views=keep_views)


def run(graph, path) -> Session:
    write_package(
        path, graph=graph.graph_dict(), tensors=graph.tensors, inputs=graph.inputs, outputs=graph.outputs
    )
    return Session(path, threads=1)


def check(tmp_path, source: onnx.ModelProto, feeds, keep_views: bool = True, exact: bool = True):
    """Lower, run with the engine and onnxruntime, compare; return the lowered graph's ops."""
    graph = lowered(source, keep_views)
    got = run(graph, tmp_path / "lowered.ferry").run(feeds)
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for spec, expected in zip(graph.outputs, want, strict=True):
        assert got[spec["name"]].shape == expected.shape
        assert got[spec["name"]].dtype == expected.dtype
        if exact:
            np.testing.assert_array_equal(got[spec["name"]], expected)
        else:
            np.testing.assert_allclose(got[spec["name"]], expected, rtol=1e-4, atol=1e-5)
    return [node["op"] for node in graph.nodes], graph


def single(op: str, inputs, shape, dtype, outputs=("y",), initializers=(), opset=18, **attrs):
    """A one-node model over x (static ``shape``); outputs typed, shapes left to inference."""
    node = helper.make_node(op, ["x", *inputs], list(outputs), **attrs)
    outs = [helper.make_tensor_value_info(name, DTYPES[dtype], None) for name in outputs]
    return model([node], [value("x", dtype, shape)], outs, initializers=initializers, opset=opset)


def assert_lowered(ops: list[str], op: str) -> None:
    """Only Raster nodes left (or a Reshape, when the movement turned out to be the identity)."""
    assert op not in ops or op == "Reshape"
    assert set(ops) <= {"Raster", "Reshape"}


# --- each op kind ------------------------------------------------------------------------------


@SETTINGS
@given(shape=dims, data=st.data(), dtype=st.sampled_from(sorted(DTYPES)))
def test_transpose(tmp_path, shape, data, dtype):
    perm = data.draw(st.permutations(range(len(shape))))
    ops, _ = check(
        tmp_path, single("Transpose", [], shape, dtype, perm=list(perm)), {"x": random_input(shape, dtype)}
    )
    assert_lowered(ops, "Transpose")


@SETTINGS
@given(shape=dims, data=st.data(), dtype=st.sampled_from(sorted(DTYPES)))
def test_slice(tmp_path, shape, data, dtype):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    axes = [a - rank if data.draw(st.booleans()) else a for a in axes]
    starts = [data.draw(st.integers(-6, 6)) for _ in axes]
    ends = [data.draw(st.sampled_from([-100, -3, -1, 0, 1, 2, 3, 5, 100])) for _ in axes]
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    inits = [ints("starts", starts), ints("ends", ends), ints("axes", axes), ints("steps", steps)]
    source = single("Slice", ["starts", "ends", "axes", "steps"], shape, dtype, initializers=inits)
    ops, _ = check(tmp_path, source, {"x": random_input(shape, dtype)})
    assert_lowered(ops, "Slice")


@SETTINGS
@given(shape=dims, data=st.data(), dtype=st.sampled_from(sorted(DTYPES)))
def test_concat(tmp_path, shape, data, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    count = data.draw(st.integers(1, 3))
    shapes = [list(shape) for _ in range(count)]
    for part in shapes:
        part[axis] = data.draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(count)]
    source = model(
        [helper.make_node("Concat", [*names, names[0]], ["y"], axis=axis)],
        [value(n, dtype, s) for n, s in zip(names, shapes, strict=True)],
        [helper.make_tensor_value_info("y", DTYPES[dtype], None)],
    )
    feeds = {n: random_input(s, dtype, seed=i) for i, (n, s) in enumerate(zip(names, shapes, strict=True))}
    ops, graph = check(tmp_path, source, feeds)
    assert ops == ["Raster"]
    assert len(graph.nodes[0]["attrs"]["regions"]) == count + 1


@SETTINGS
@given(shape=dims, data=st.data(), dtype=st.sampled_from(["float32", "int32"]), with_axes=st.booleans())
def test_pad_constant(tmp_path, shape, data, dtype, with_axes):
    rank = len(shape)
    axes = list(range(rank))
    if with_axes:
        axes = data.draw(
            st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank)
        )
    begin, end = [], []
    for axis in axes:
        dim = shape[axis]
        b = data.draw(st.integers(-dim, 3))
        begin.append(b)
        end.append(data.draw(st.integers(-(dim + min(b, 0)), 3)))  # at least nothing left
    fill = numpy_helper.from_array(np.array(7, dtype=dtype), "value")
    inits = [ints("pads", begin + end), fill] + ([ints("axes", axes)] if with_axes else [])
    inputs = ["pads", "value"] + (["axes"] if with_axes else [])
    ops, _ = check(
        tmp_path, single("Pad", inputs, shape, dtype, initializers=inits), {"x": random_input(shape, dtype)}
    )
    assert_lowered(ops, "Pad")


@SETTINGS
@given(shape=dims, data=st.data())
def test_expand(tmp_path, shape, data):
    target = [d if data.draw(st.booleans()) or d != 1 else data.draw(st.integers(1, 3)) for d in shape]
    target = [1] * data.draw(st.integers(0, 2)) + target
    shape = [1 if data.draw(st.booleans()) else d for d in shape]  # broadcast these dims
    source = single("Expand", ["shape"], shape, "float32", initializers=[ints("shape", target)])
    ops, _ = check(tmp_path, source, {"x": random_input(shape, "float32")})
    assert_lowered(ops, "Expand")


@SETTINGS
@given(shape=dims, data=st.data(), dtype=st.sampled_from(sorted(DTYPES)))
def test_gather_with_constant_indices(tmp_path, shape, data, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    index = st.integers(-dim, dim - 1)
    if data.draw(st.booleans()):
        indices = np.array(data.draw(index), np.int64)
    else:
        indices = np.array(data.draw(st.lists(index, min_size=1, max_size=6)), np.int64)
    inits = [numpy_helper.from_array(indices, "indices")]
    source = single("Gather", ["indices"], shape, dtype, initializers=inits, axis=axis)
    ops, _ = check(tmp_path, source, {"x": random_input(shape, dtype)})
    assert_lowered(ops, "Gather")


@SETTINGS
@given(shape=dims, data=st.data(), given_sizes=st.booleans())
def test_split(tmp_path, shape, data, given_sizes):
    axis = data.draw(st.integers(0, len(shape) - 1))
    if given_sizes:
        sizes, left = [], shape[axis]
        while left:
            sizes.append(data.draw(st.integers(1, left)))
            left -= sizes[-1]
        outputs = [f"y{i}" for i in range(len(sizes))]
        source = single(
            "Split", ["sizes"], shape, "float32", outputs, initializers=[ints("sizes", sizes)], axis=axis
        )
    else:
        dim = shape[axis]  # onnxruntime refuses a split whose last chunk would be empty
        parts = data.draw(st.sampled_from([p for p in range(1, dim + 1) if -(-dim // p) * (p - 1) < dim]))
        outputs = [f"y{i}" for i in range(parts)]
        source = single("Split", [], shape, "float32", outputs, axis=axis, num_outputs=parts)
    ops, _ = check(tmp_path, source, {"x": random_input(shape, "float32")})
    assert_lowered(ops, "Split")
    assert len(ops) == len(outputs)


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "shape"),
    [
        ("Reshape", ["shape"], {}, [2, 3, 4]),
        ("Flatten", [], {"axis": 2}, [2, 3, 4]),
        ("Squeeze", ["axes"], {}, [2, 1, 4]),
        ("Unsqueeze", ["axes"], {}, [2, 3, 4]),
    ],
)
def test_views_lower_to_one_region_and_stay_views_alone(tmp_path, op, inputs, attrs, shape):
    inits = [ints("shape", [4, -1]), ints("axes", [1])]
    source = single(op, inputs, shape, "float32", initializers=inits, **attrs)
    feeds = {"x": random_input(shape, "float32")}
    ops, graph = check(tmp_path, source, feeds, keep_views=False)
    assert ops == ["Raster"] and len(graph.nodes[0]["attrs"]["regions"]) == 1
    ops, _ = check(tmp_path, source, feeds)
    assert ops == [op]  # alone it is a free view in the engine: left as it was


# --- what is left alone ---------------------------------------------------------------------


def test_dynamic_shapes_and_runtime_inputs_are_left_alone(tmp_path):
    source = model(
        [
            helper.make_node("Transpose", ["d"], ["dt"], perm=[1, 0]),  # d is [n, 3]
            helper.make_node("Slice", ["x", "starts", "ends"], ["xs"]),  # bounds computed at run time
            helper.make_node("Gather", ["x", "idx"], ["xg"], axis=1),  # indices fed at run time
            helper.make_node("Pad", ["x", "pads"], ["xp"], mode="reflect"),
        ],
        [
            value("d", "float32", ["n", 3]),
            value("x", "float32", [3, 4]),
            value("starts", "int64", [1]),
            value("ends", "int64", [1]),
            value("idx", "int64", [2]),
        ],
        [value(name, "float32", None) for name in ("dt", "xs", "xg", "xp")],
        initializers=[ints("pads", [1, 1, 1, 1])],
    )
    feeds = {
        "d": random_input([5, 3], "float32"),
        "x": random_input([3, 4], "float32"),
        "starts": np.array([1], np.int64),
        "ends": np.array([3], np.int64),
        "idx": np.array([3, 0], np.int64),
    }
    ops, _ = check(tmp_path, source, feeds)
    assert ops == ["Transpose", "Slice", "Gather", "Pad"]


# --- merging ------------------------------------------------------------------------------------


def test_transpose_chain_merges_into_one_raster(tmp_path):
    source = model(
        [
            helper.make_node("Transpose", ["x"], ["t1"], perm=[2, 0, 1, 3]),
            helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 2, 1]),
            helper.make_node("Transpose", ["t2"], ["y"], perm=[1, 0, 2, 3]),
        ],
        [value("x", "float32", [2, 3, 4, 5])],
        [value("y", "float32", None)],
    )
    ops, graph = check(tmp_path, source, {"x": random_input([2, 3, 4, 5], "float32")})
    assert ops == ["Raster"] and len(graph.nodes[0]["attrs"]["regions"]) == 1


@pytest.mark.parametrize(
    ("shape", "first", "perm", "last"),
    [
        ([2, 12], [2, 3, 2, 2], [0, 2, 1, 3], [6, 4]),  # head split -> swap -> merge
        ([1, 8, 3, 5], [1, 2, 2, 2, 3, 5], [0, 1, 4, 2, 5, 3], [1, 2, 6, 10]),  # pixel shuffle
        ([4, 6], [2, 2, 6], [2, 1, 0], [6, 4]),
    ],
)
def test_reshape_transpose_reshape_merges_into_one_raster(tmp_path, shape, first, perm, last):
    source = model(
        [
            helper.make_node("Reshape", ["x", "first"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=perm),
            helper.make_node("Reshape", ["t", "last"], ["y"]),
        ],
        [value("x", "float32", shape)],
        [value("y", "float32", None)],
        initializers=[ints("first", first), ints("last", last)],
    )
    ops, graph = check(tmp_path, source, {"x": random_input(shape, "float32")})
    assert ops == ["Raster"] and len(graph.nodes[0]["attrs"]["regions"]) == 1


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@SETTINGS
@given(shape=dims, data=st.data())
def test_random_chains_stay_exact_when_merged(tmp_path, shape, data):
    """Transpose / Slice / Reshape / Gather chains: merged or not, the result is the same."""
    nodes, inits, current, now = [], [], "x", list(shape)
    for k in range(data.draw(st.integers(2, 4))):
        kind, out, rank = (
            data.draw(st.sampled_from(["Transpose", "Slice", "Reshape", "Gather"])),
            f"v{k}",
            len(now),
        )
        if kind == "Transpose":
            perm = list(data.draw(st.permutations(range(rank))))
            nodes.append(helper.make_node("Transpose", [current], [out], perm=perm))
            now = [now[p] for p in perm]
        elif kind == "Slice":
            axis = data.draw(st.integers(0, rank - 1))
            dim = now[axis]
            start, end, step = data.draw(
                st.sampled_from([(0, dim, 2), (dim - 1, -dim - 1, -1), (dim // 2, dim, 1)])
            )
            inits += [
                ints(f"s{k}", [start]),
                ints(f"e{k}", [end]),
                ints(f"a{k}", [axis]),
                ints(f"t{k}", [step]),
            ]
            nodes.append(helper.make_node("Slice", [current, f"s{k}", f"e{k}", f"a{k}", f"t{k}"], [out]))
            now[axis] = len(range(dim)[start : (None if end < 0 else end) : step])
        elif kind == "Reshape":
            factors = list(data.draw(st.permutations(_factors(int(np.prod(now)))))) or [1]
            cuts = sorted(data.draw(st.sets(st.integers(1, max(len(factors) - 1, 1)), max_size=3)))
            parts = [factors[a:b] for a, b in zip([0, *cuts], [*cuts, len(factors)], strict=True)]
            now = [int(np.prod(p)) for p in parts if p]
            inits.append(ints(f"shape{k}", now))
            nodes.append(helper.make_node("Reshape", [current, f"shape{k}"], [out]))
        else:
            axis = data.draw(st.integers(0, rank - 1))
            picked = data.draw(st.lists(st.integers(0, now[axis] - 1), min_size=1, max_size=4))
            inits.append(ints(f"i{k}", picked))
            nodes.append(helper.make_node("Gather", [current, f"i{k}"], [out], axis=axis))
            now[axis] = len(picked)
        current = out
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    source = model(nodes, [value("x", "float32", shape)], [value("y", "float32", None)], initializers=inits)
    ops, _ = check(tmp_path, source, {"x": random_input(shape, "float32")})
    assert ops.count("Raster") <= len(nodes) - 1


def test_a_chain_whose_composition_is_not_strided_is_not_merged(tmp_path):
    source = model(
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),  # [3, 2]
            helper.make_node("Reshape", ["t", "shape"], ["r"]),  # [2, 3]: merges (flat order is kept)
            helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0]),  # r's columns cut across t's rows
        ],
        [value("x", "float32", [2, 3])],
        [value("y", "float32", None)],
        initializers=[ints("shape", [2, 3])],
    )
    ops, _ = check(tmp_path, source, {"x": random_input([2, 3], "float32")})
    assert ops == ["Raster", "Raster"]


def test_a_raster_read_twice_or_with_fill_is_not_merged(tmp_path):
    source = model(
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
            helper.make_node("Transpose", ["t"], ["y1"], perm=[1, 0]),
            helper.make_node("Relu", ["t"], ["y2"]),
            helper.make_node("Pad", ["x", "pads"], ["p"]),
            helper.make_node("Transpose", ["p"], ["y3"], perm=[1, 0]),
        ],
        [value("x", "float32", [3, 4])],
        [value(name, "float32", None) for name in ("y1", "y2", "y3")],
        initializers=[ints("pads", [1, 0, 0, 2])],
    )
    ops, _ = check(tmp_path, source, {"x": random_input([3, 4], "float32")})
    assert ops == ["Raster", "Raster", "Relu", "Raster", "Raster"]


# --- the kernel's own guards ------------------------------------------------------------------


def test_raster_regions_out_of_bounds_fail_cleanly():
    attrs = {
        "shape": [4],
        "regions": [
            {
                "input": 0,
                "src_offset": 2,
                "src_strides": [1],
                "dst_offset": 0,
                "dst_strides": [1],
                "size": [4],
            }
        ],
    }
    assert CHECKS["Raster"](attrs, 1, 1) is None
    with pytest.raises(IndexError, match="reads"):
        REGISTRY["Raster"]([np.arange(4, dtype=np.float32)], attrs)
    attrs["regions"][0]["dst_offset"] = 1
    assert "writes outside" in CHECKS["Raster"](attrs, 1, 1)


# --- whole models -------------------------------------------------------------------------------


def static(source: onnx.ModelProto, fixed: dict[str, int]) -> onnx.ModelProto:
    """The model with its symbolic input/output dims pinned."""
    source = onnx.ModelProto.FromString(source.SerializeToString())
    for spec in [*source.graph.input, *source.graph.output]:
        for dim in spec.type.tensor_type.shape.dim:
            if dim.dim_param in fixed:
                dim.dim_value = fixed[dim.dim_param]
    return source


def whole_models():
    rng = np.random.default_rng(3)
    return {
        "classifier": (
            static(build_image_classifier(), {"N": 2}),
            {"image": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)},
        ),
        "attention": (
            static(attention_block(), {"batch": 2, "seq": 5}),
            {"x": rng.standard_normal((2, 5, D)).astype(np.float32)},
        ),
    }


@pytest.mark.parametrize("name", ["classifier", "attention"])
def test_whole_model_converts_and_matches_onnxruntime(tmp_path, name):
    source, feeds = whole_models()[name]
    dst = tmp_path / f"{name}.ferry"
    convert(source, dst)
    ops = [node["op"] for node in read_package(dst).graph["nodes"]]
    if name == "attention":
        # Lowered to Raster, whose head split/merge then folds into the attention node's views.
        assert "Transpose" not in ops and "Split" not in ops and "FusedAttention" in ops
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = Session(dst).run(feeds)
    for spec, expected in zip(source.graph.output, want, strict=True):
        np.testing.assert_allclose(got[spec.name], expected, rtol=1e-4, atol=1e-5)


def test_every_prefix_of_the_pipeline_matches_onnxruntime_on_static_attention(tmp_path):
    source, feeds = whole_models()["attention"]
    graph = translate(onnx.shape_inference.infer_shapes(source, strict_mode=True), 20)
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    assert optimize.PASSES.index(lower_data_movement) == optimize.PASSES.index(optimize.fuse_activation) + 1
    for step in optimize.PASSES:
        graph = step(graph)
        got = run(graph, tmp_path / f"{step.__name__}.ferry").run(feeds)
        for spec, expected in zip(graph.outputs, want, strict=True):
            np.testing.assert_allclose(
                got[spec["name"]], expected, rtol=1e-4, atol=1e-5, err_msg=step.__name__
            )


def test_raster_in_a_user_model_is_refused(tmp_path):
    source = model(
        [helper.make_node("Raster", ["x"], ["y"], name="sneaky", shape=[2])],
        [value("x", "float32", [2])],
        [value("y", "float32", [2])],
    )
    with pytest.raises(UnsupportedOperatorsError) as info:
        convert(source, tmp_path / "out.ferry")
    assert info.value.operators == {"Raster": ["sneaky"]}
    assert not (tmp_path / "out.ferry").exists()
