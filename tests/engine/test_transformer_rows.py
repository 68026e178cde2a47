"""The converter's row narrowing (``converter.optimize.narrow_rows``) on ViT-style encoders: a
classifier that reads one token row of the last block computes only that row there, with the
same results as onnxruntime on the whole model."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from converter import convert
from engine import Session
from engine.format import read_package
from tests.converter.models import fvalue, model


class _Builder:
    """ONNX nodes and random weights for a pre-LN transformer, the way torch exports one."""

    def __init__(self, seed: int, seq: int, heads: int, dim: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.seq, self.heads, self.dim, self.width = seq, heads, dim, heads * dim
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, array: np.ndarray) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, *shape: int, scale: float = 0.3) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"v{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def linear(self, x: str, k: int, n: int) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.weight(k, n)]), self.weight(n)])

    def layer_norm(self, x: str) -> str:
        scale = (1 + 0.2 * self.rng.standard_normal(self.width)).astype(np.float32)
        return self.op("LayerNormalization", [x, self.const(scale), self.weight(self.width)], axis=-1)

    def gelu(self, x: str) -> str:
        erf = self.op("Erf", [self.op("Div", [x, self.const(np.float32(math.sqrt(2)))])])
        one = self.op("Add", [erf, self.const(np.float32(1))])
        return self.op("Mul", [self.op("Mul", [x, one]), self.const(np.float32(0.5))])

    def attention(self, x: str) -> str:
        s, h, d, e = self.seq, self.heads, self.dim, self.width
        qkv = self.linear(x, e, 3 * e)
        split = self.op("Reshape", [qkv, self.const(np.array([1, s, 3, h, d], np.int64))])
        parts = self.op("Transpose", [split], perm=[2, 0, 3, 1, 4])
        q, k, v = (self.op("Gather", [parts, self.const(np.array(i, np.int64))], axis=0) for i in range(3))
        scores = self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])])
        probs = self.op("Softmax", [self.op("Mul", [scores, self.const(np.float32(d**-0.5))])], axis=-1)
        merged = self.op("Transpose", [self.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        return self.linear(self.op("Reshape", [merged, self.const(np.array([1, s, e], np.int64))]), e, e)

    def block(self, x: str) -> str:
        x = self.op("Add", [x, self.attention(self.layer_norm(x))])
        hidden = self.gelu(self.linear(self.layer_norm(x), self.width, 2 * self.width))
        return self.op("Add", [x, self.linear(hidden, 2 * self.width, self.width)])


def vit_classifier(seed: int, seq: int, heads: int, dim: int, blocks: int, row: int) -> onnx.ModelProto:
    """Blocks, a positional term added after them (a constant with a row axis), a final
    LayerNorm and a head reading token ``row``."""
    b = _Builder(seed, seq, heads, dim)
    x = "x"
    for _ in range(blocks):
        x = b.block(x)
    x = b.layer_norm(b.op("Add", [x, b.weight(1, seq, b.width)]))
    token = b.op("Gather", [x, b.const(np.array(row, np.int64))], axis=1)
    b.nodes.append(helper.make_node("Gemm", [token, b.weight(3, b.width), b.weight(3)], ["y"], transB=1))
    return model(b.nodes, [fvalue("x", [1, seq, b.width])], [fvalue("y", [1, 3])], initializers=b.inits)


def _run_both(source: onnx.ModelProto, path, seq: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    feeds = {"x": np.random.default_rng(seq).standard_normal((1, seq, width)).astype(np.float32)}
    onnxruntime = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
    want = onnxruntime.run(None, feeds)
    session = Session(path, threads=1)
    got = [session.run(feeds)["y"] for _ in range(2)]  # the recorded run and the planned run
    return got[-1], want[0]


@settings(max_examples=10, deadline=None)
@given(
    st.integers(0, 2**16),
    st.integers(2, 12),
    st.integers(1, 3),
    st.sampled_from([4, 8]),
    st.integers(1, 2),
    st.booleans(),
)
def test_last_block_runs_on_the_row_the_head_reads(tmp_path_factory, seed, seq, heads, dim, blocks, last):
    row = seq - 1 if last else 0
    source = vit_classifier(seed, seq, heads, dim, blocks, row)
    path = tmp_path_factory.mktemp("rows") / "vit.ferry"
    convert(source, path)
    nodes = read_package(path).graph["nodes"]
    attention = [node for node in nodes if node["op"] == "FusedAttention"]
    if heads > 1:  # else the head split and merge are reshapes: no views, q is sliced by a Raster
        assert [a["attrs"]["out_view"]["shape"][-2] for a in attention] == [seq] * (blocks - 1) + [1]
        last_query = attention[-1]["attrs"]["views"][0]
        assert last_query["shape"][-2] == 1 and last_query["offset"] == row * 3 * heads * dim
    # the last block's residual input and the positional constant, sliced to the one row
    package = read_package(path)
    assert sum(node["name"].endswith("/slice") for node in nodes) == (1 if heads > 1 else 2)  # and q
    assert [name for name in package.tensors if "@rows" in name] != []
    assert all(t.shape[-2] == 1 for name, t in package.tensors.items() if "@rows" in name)
    # each block's LayerNorms feed MatMuls only: their scale and bias went into those weights
    scales = [package.tensors[node["inputs"][1]] for node in nodes if node["op"] == "LayerNormalization"]
    assert [bool(np.all(scale == 1)) for scale in scales] == [True] * (2 * blocks) + [False]
    got, want = _run_both(source, path, seq, heads * dim)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rows_stay_whole_when_another_node_reads_them(tmp_path):
    """The final LayerNorm's output is also a graph output: nothing may be narrowed."""
    source = vit_classifier(3, 6, 2, 4, 1, 0)
    source.graph.output.append(fvalue(source.graph.node[-2].input[0], [1, 6, 8]))
    path = tmp_path / "vit.ferry"
    convert(source, path)
    attention = next(n for n in read_package(path).graph["nodes"] if n["op"] == "FusedAttention")
    assert attention["attrs"]["out_view"]["shape"] == [1, 6, 8]
    got, want = _run_both(source, path, 6, 8)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _self_attention_on(seed: int, seq: int, width: int, row: int, residual: bool) -> onnx.ModelProto:
    """h = x + c; attention with queries h @ Wq and h itself as keys and values (and, with
    ``residual``, h added to its output); the head reads token ``row``."""
    b = _Builder(seed, seq, 1, width)
    h = b.op("Add", ["x", b.weight(1, seq, width)])
    scores = b.op(
        "MatMul", [b.op("MatMul", [h, b.weight(width, width)]), b.op("Transpose", [h], perm=[0, 2, 1])]
    )
    probs = b.op("Softmax", [b.op("Mul", [scores, b.const(np.float32(width**-0.5))])], axis=-1)
    out = b.op("MatMul", [probs, h])
    out = b.op("Add", [out, h]) if residual else out
    token = b.op("Gather", [out, b.const(np.array(row, np.int64))], axis=1)
    b.nodes.append(helper.make_node("Gemm", [token, b.weight(3, width), b.weight(3)], ["y"], transB=1))
    return model(b.nodes, [fvalue("x", [1, seq, width])], [fvalue("y", [1, 3])], initializers=b.inits)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("row", [0, 5])
def test_keys_and_values_stay_whole_when_the_queries_are_narrowed(tmp_path, row, residual):
    """Only the queries follow the selected row: a value also read as keys or values keeps
    every row (its query rows are sliced off it instead)."""
    source = _self_attention_on(4, 6, 8, row, residual)
    path = tmp_path / "attn.ferry"
    convert(source, path)
    attention = next(n for n in read_package(path).graph["nodes"] if n["op"] == "FusedAttention")
    assert attention["inputs"][1] == attention["inputs"][2] and "@rows" not in attention["inputs"][1]
    got, want = _run_both(source, path, 6, 8)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_two_selections_of_one_value_slice_it_under_distinct_names(tmp_path):
    """Two heads read rows of two branches of x: each narrowing slices x, each slice is its own
    value made by its own node (the graph stays single-assignment, node names unique)."""
    b = _Builder(6, 6, 1, 8)
    outputs = []
    for index, (op, row) in enumerate((("Tanh", 0), ("Sigmoid", 0))):
        branch = b.op(op, [b.op("Add", ["x", b.weight(1, 6, 8)])])
        b.nodes.append(
            helper.make_node("Gather", [branch, b.const(np.array(row, np.int64))], [f"y{index}"], axis=1)
        )
        outputs.append(fvalue(f"y{index}", [1, 8]))
    source = model(b.nodes, [fvalue("x", [1, 6, 8])], outputs, initializers=b.inits)
    path = tmp_path / "two.ferry"
    convert(source, path)
    nodes = read_package(path).graph["nodes"]
    produced = [name for node in nodes for name in node["outputs"] if name]
    assert len(produced) == len(set(produced)) and len({n["name"] for n in nodes}) == len(nodes)
    assert sum("@rows" in name for name in produced) == 2
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 6, 8)).astype(np.float32)}
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = Session(path, threads=1).run(feeds)
    for index, expected in enumerate(want):
        np.testing.assert_allclose(got[f"y{index}"], expected, rtol=1e-5, atol=1e-6)
