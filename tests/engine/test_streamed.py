"""One-row products with the weights streamed row by row (engine/ops/streamed.py), and the
search timing them with the weights out of cache (engine/search.py's ``weights_evictor``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from engine import Session, kernels, search, session
from engine import jit as jit_tier
from engine.ops import streamed
from engine.ops.fused import BIAS_ROWS, fused_matmul
from engine.ops.gemm import matmul
from engine.ops.registry import REGISTRY
from tests.engine.helpers import run_reference, write_model_package


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 300),
    st.sampled_from([(), (1,), (1, 1)]),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from(["none", "row", "tiled"]),
    st.sampled_from([None, "Relu", "Sigmoid"]),
    st.integers(0, 2**32 - 1),
)
def test_streamed_products_match_numpy(k, n, lead, dtype, bias_kind, activation, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, k)).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    attrs = {"activation": activation} if activation else {}
    biases = {"none": [], "row": [bias], "tiled": [np.tile(bias, BIAS_ROWS)]}
    inputs = [x, w, *biases[bias_kind]]
    want = fused_matmul(inputs, attrs)[0]
    got = streamed.fused_matmul_streamed(inputs, attrs)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.sqrt(k))
    plain = streamed.matmul_streamed([x, w], {})[0]
    assert plain.shape == np.matmul(x, w).shape
    np.testing.assert_allclose(plain, x.astype(np.float64) @ w, rtol=tolerance, atol=tolerance * np.sqrt(k))


@pytest.mark.parametrize(
    "case",
    ["rows", "strided weights", "mixed dtypes", "integers"],
)
def test_other_shapes_run_the_default_kernel(case):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 24)).astype(np.float32)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    if case == "rows":
        x = rng.standard_normal((3, 24)).astype(np.float32)
    elif case == "strided weights":
        w = rng.standard_normal((40, 24)).astype(np.float32).T
    elif case == "mixed dtypes":
        w = w.astype(np.float64)
    else:
        x, w = (a.astype(np.int32) for a in (x * 4, w * 4))
    np.testing.assert_array_equal(streamed.matmul_streamed([x, w], {})[0], matmul([x, w], {})[0])
    np.testing.assert_array_equal(streamed.fused_matmul_streamed([x, w], {})[0], fused_matmul([x, w], {})[0])


def test_one_row_products_have_the_streamed_kernel_beside_blas():
    one_row = [(1, 1, 64), (64, 32), (32,)]
    for op, kernel in (("FusedMatMul", streamed.fused_matmul_streamed), ("MatMul", streamed.matmul_streamed)):
        assert kernels.candidates(op, {}, one_row[: 3 if op == "FusedMatMul" else 2], use_jit=False) == [
            REGISTRY[op],
            kernel,
        ]
        assert kernels.candidates(op, {}, [(4, 64), (64, 32)], use_jit=False) == [REGISTRY[op]]
        assert kernels.candidates(op, {}, [(1, 64), (2, 64, 32)], use_jit=False) == [REGISTRY[op]]


def test_weights_evictor_only_for_big_weights_in_a_plan_bigger_than_the_cache(monkeypatch):
    monkeypatch.setattr(search, "last_level_cache_bytes", lambda: 1 << 20)
    big = np.ones((256, 512), np.float32)  # 512 KB
    static = {"w": big, **{f"other{i}": np.ones((256, 512), np.float32) for i in range(4)}}
    assert search.weights_evictor(static, ["w"]) is not None  # 2 MB besides its own 512 KB
    assert search.weights_evictor(static, []) is None  # no weights of its own
    assert search.weights_evictor({**static, "w": np.ones(1000, np.float32)}, ["w"]) is None  # 4 KB
    assert search.weights_evictor({"w": big, "other": big.copy()}, ["w"]) is None  # the rest fits
    strided = {"w": big, **{f"t{i}": np.ones((512, 256), np.float32).T for i in range(4)}}
    assert search.weights_evictor(strided, ["w"]) is None  # only contiguous ones are read
    evict = search.weights_evictor(static, ["w"])
    evict([big])  # reads a byte of each cache line of the others, and leaves them as they were
    assert all(np.all(value == 1) for value in static.values())


def test_a_one_row_products_weights_are_flushed_where_the_plan_fits_the_cache(monkeypatch):
    """A classifier's GEMV in a plan smaller than the cache is timed with its own weights
    flushed (the run's activations and the rest of the machine pass through the cache too);
    a product of many rows, or a session without the flush kernel, is timed warm."""
    monkeypatch.setattr(search, "last_level_cache_bytes", lambda: 32 << 20)
    w, bias = np.ones((1000, 1280), np.float32), np.ones(1000, np.float32)
    static = {"w": w, "b": bias, "other": np.ones((512, 512), np.float32)}
    flushed: list[int] = []
    flush = flushed.append  # records what it is given: each array's bytes, once a call

    evict = search.weights_evictor(
        static, ["w", "b"], one_row=True, flush=lambda data: flush(data.nbytes), positions=[1, 2]
    )
    assert evict is not None
    evict([np.ones((1, 1280), np.float32), w, bias])  # the candidate's args: its fixed ones flushed
    assert flushed == [w.nbytes, bias.nbytes]
    assert search.weights_evictor(static, ["w", "b"], one_row=False, flush=flush) is None
    assert search.weights_evictor(static, ["w", "b"], one_row=True, flush=None) is None
    assert search.weights_evictor(static, ["b"], one_row=True, flush=flush) is None  # 4 KB


def test_any_nodes_big_weights_are_flushed_where_the_models_weights_do_not_stay_cached(monkeypatch):
    """Where the model's weights do not stay cached between runs (measured: ``cached()``), a
    conv's candidates are timed with their own packed weights flushed, each as it packs them;
    the measurement is asked only for a node whose weights are big enough to matter."""
    monkeypatch.setattr(search, "last_level_cache_bytes", lambda: 480 << 20)
    w = np.ones((512, 512, 3, 3), np.float32)  # 9.4 MB
    static = {"w": w, "other": np.ones(1000, np.float32)}
    flushed: list[int] = []
    asked: list[bool] = []

    def cached(answer: bool):  # noqa: ANN202
        return lambda: asked.append(answer) or answer

    evict = search.weights_evictor(static, ["w"], False, flushed.append, [1], cached(False))
    packed = np.ones((16, 4610, 32), np.float32)  # a candidate's panels, not the ONNX weights
    evict([np.ones((1, 512, 7, 7), np.float32), packed])
    assert [flat.nbytes for flat in flushed] == [packed.nbytes] and asked == [False]
    assert search.weights_evictor(static, ["w"], False, flushed.append, [1], cached(True)) is None
    asked.clear()
    assert search.weights_evictor(static, ["other"], False, flushed.append, [1], cached(False)) is None
    assert asked == []  # 4 KB of weights: not worth measuring for


def test_weights_that_fit_the_cache_stay_cached():
    if not jit_tier.enabled():
        pytest.skip("no JIT tier (numba missing, or FERRY_JIT=0)")
    flush_jit = jit_tier.module("engine.ops.flush_jit")
    static = {"w": np.ones(64 << 10, np.float32), "b": np.ones(16, np.float32), "step": 3}  # 256 KB
    assert search.weights_stay_cached(static, flush_jit.flush)
    assert np.all(static["w"] == 1) and np.all(static["b"] == 1)


def test_the_flush_kernel_leaves_an_arrays_values_as_they_were():
    if not jit_tier.enabled():
        pytest.skip("no JIT tier (numba missing, or FERRY_JIT=0)")
    flush_jit = jit_tier.module("engine.ops.flush_jit")
    for size in (1, 63, 64, 4097, 1 << 20):
        data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        data.flags.writeable = False  # weights mapped from a package are read-only
        want = data.copy()
        flush_jit.flush(data)
        assert np.array_equal(data, want)


def test_last_level_cache_size_is_read_or_defaults():
    size = search.last_level_cache_bytes()
    assert size >= 1 << 20 and size % 1024 == 0


def _decode_like_model(k: int, n: int) -> tuple:
    """Two one-row products by fixed weights (a decode step's shape), the second with a bias."""
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((k, n)).astype(np.float32)
    w2 = rng.standard_normal((n, k)).astype(np.float32)
    b2 = rng.standard_normal(k).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        helper.make_node("MatMul", ["h", "w2"], ["hw"], name="down"),
        helper.make_node("Add", ["hw", "b2"], ["y"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "decode",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, name) for a, name in ((w1, "w1"), (w2, "w2"), (b2, "b2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, 1, k)).astype(np.float32)}


def test_a_decode_steps_products_are_searched_with_their_weights_out_of_cache(tmp_path, monkeypatch):
    """With the plan's weights bigger than the cache, each product's candidates are timed after
    the other weights are read through (as a run reads them); the result is the reference's."""
    monkeypatch.setattr(search, "last_level_cache_bytes", lambda: 256 << 10)
    calls: list[str] = []

    def counting(static: dict, own: list, *more: object) -> object:
        evict = search.weights_evictor(static, own, *more)
        if evict is None:
            return None

        def counted(args: list) -> None:
            calls.append(",".join(own))
            evict(args)

        return counted

    monkeypatch.setattr(session, "weights_evictor", counting)
    model, feeds = _decode_like_model(256, 512)  # two 512 KB matrices
    path = write_model_package(model, tmp_path / "decode.ferry", feeds)
    engine_session = Session(path, threads=1, jit=False)
    for _ in range(3):
        got = engine_session.run(feeds)["y"]
    np.testing.assert_allclose(got, run_reference(model, feeds)[0], rtol=1e-4, atol=1e-3)
    products = [t for t in engine_session.profile(feeds) if "MatMul" in t.op]
    assert products and all(t.note.startswith("searched") for t in products)
    assert {t.kernel.rsplit(".", 1)[-1] for t in products} <= {
        "matmul",
        "matmul_streamed",
        "fused_matmul",
        "fused_matmul_streamed",
    }
    assert len(calls) >= 2 * 2 * search.RUNS  # every timed call of both candidates, both nodes


def _cnn_head_model() -> tuple:
    """A 3x3 conv (it brings the JIT kernels in), a global pool and a classifier (a one-row
    Gemm by B^T, 1.2 MB of weights)."""
    rng = np.random.default_rng(3)
    inits = {
        "wc": rng.standard_normal((512, 8, 3, 3)).astype(np.float32) * 0.1,
        "wg": rng.standard_normal((600, 512)).astype(np.float32) * 0.05,
        "bg": rng.standard_normal(600).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "wc"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="classifier", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 600])],
        [numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, 8, 14, 14)).astype(np.float32)}


def test_a_jit_sessions_classifier_is_searched_with_its_weights_flushed(tmp_path, monkeypatch):
    """In a small plan (it fits the cache), the classifier's candidates are each timed after
    flush_jit evicted its weights; the conv's, warm.  The result is the reference's."""
    if not jit_tier.enabled():
        pytest.skip("no JIT tier (numba missing, or FERRY_JIT=0)")
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(tmp_path / "kernels"))
    built: dict[str, bool] = {}

    def spying(static: dict, own: list, *more: object) -> object:
        evict = search.weights_evictor(static, own, *more)
        built[",".join(own)] = evict is not None
        return evict

    monkeypatch.setattr(session, "weights_evictor", spying)
    model, feeds = _cnn_head_model()
    path = write_model_package(model, tmp_path / "head.ferry", feeds)
    engine_session = Session(path, threads=1)
    for _ in range(3):
        got = engine_session.run(feeds)["y"]
    np.testing.assert_allclose(got, run_reference(model, feeds)[0], rtol=1e-4, atol=1e-4)
    assert built.get("wg,bg") is True
    assert built.get("wc") is False
