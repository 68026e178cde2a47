"""Session end to end: the sample classifier vs onnxruntime, bad feeds, bad packages, debug, profile."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from threadpoolctl import threadpool_info

from converter import convert
from converter.samples import build_image_classifier
from engine import (
    InputError,
    NodeExecutionError,
    PackageError,
    PackageIntegrityError,
    Session,
    TensorSpec,
    UnsupportedOperatorError,
    jit,
)
from engine import search as search_module
from engine import session as session_module
from engine.format import FORMAT_VERSION, read_package
from engine.ops import REGISTRY
from engine.program import compile_program
from tests.engine.helpers import write_model_package
from tests.model_packages import write_package

NODES = ["conv1", "relu1", "pool1", "conv2", "relu2", "gap", "flatten", "fc", "softmax"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> tuple[Path, bytes]:
    model = build_image_classifier(seed=3)
    path = tmp_path_factory.mktemp("classifier") / "model.ferry"
    convert(model, path)
    return path, model.SerializeToString()


@pytest.fixture(scope="module")
def plain_classifier(tmp_path_factory) -> Path:
    """The same classifier written node for node (no converter fusion), for per-node checks."""
    model = build_image_classifier(seed=3)
    return write_model_package(model, tmp_path_factory.mktemp("plain") / "model.ferry", {"image": images(2)})


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32)).astype(np.float32)


def write_graph(path: Path, nodes: list[dict], inputs: list[dict], outputs: list[str], tensors=None) -> Path:
    """A package written directly (no converter), for graphs the converter would refuse."""
    write_package(
        path,
        graph={"nodes": nodes, "inputs": [i["name"] for i in inputs], "outputs": outputs},
        tensors=tensors or {},
        inputs=inputs,
        outputs=[{"name": name, "dtype": "float32", "shape": None} for name in outputs],
    )
    return path


def node(name: str, op: str, inputs: list[str], outputs: list[str], **attrs) -> dict:
    return {"name": name, "op": op, "inputs": inputs, "outputs": outputs, "attrs": attrs}


# -- correctness ------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "threads"), [(1, 1), (3, 2)])
def test_classifier_matches_onnxruntime(classifier, batch, threads):
    path, onnx_bytes = classifier
    x = images(batch)
    want = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    got = Session(path, threads=threads).run({"image": x})
    assert list(got) == ["probabilities"]
    assert got["probabilities"].shape == (batch, 10)
    np.testing.assert_allclose(got["probabilities"], want, rtol=1e-4, atol=1e-4)


def test_specs_describe_the_model(classifier):
    session = Session(classifier[0])
    assert session.inputs == [TensorSpec("image", "float32", ["N", 3, 32, 32])]
    assert session.outputs == [TensorSpec("probabilities", "float32", ["N", 10])]


def test_directory_and_archive_give_the_same_results(classifier, tmp_path):
    with tarfile.open(classifier[0]) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    x = images(2)
    from_dir = Session(tmp_path / "unpacked").run({"image": x})["probabilities"]
    from_archive = Session(classifier[0]).run({"image": x})["probabilities"]
    np.testing.assert_array_equal(from_dir, from_archive)


def test_self_test_vectors_pass(classifier):
    result = Session(classifier[0]).self_test()
    assert result.passed and result.failures == []
    assert result.max_abs_error <= 1e-6


def test_self_test_needs_vectors(tmp_path):
    path = write_graph(
        tmp_path / "p.ferry",
        [node("r", "Relu", ["x"], ["y"])],
        [{"name": "x", "dtype": "float32", "shape": [2]}],
        ["y"],
    )
    with pytest.raises(PackageError, match="no self-test vectors"):
        Session(path).self_test()


def test_outputs_are_writeable_and_never_alias_feeds(tmp_path):
    path = write_graph(
        tmp_path / "p.ferry",
        [node("same", "Identity", ["x"], ["y"]), node("w", "Identity", ["weights"], ["z"])],
        [{"name": "x", "dtype": "float32", "shape": [3]}],
        ["y", "z"],
        tensors={"weights": np.arange(3, dtype=np.float32)},
    )
    x = np.ones(3, dtype=np.float32)
    out = Session(path).run({"x": x})
    out["y"][0] = 5
    out["z"][0] = 5  # would fail if this were the read-only mapped weight
    assert x[0] == 1
    np.testing.assert_array_equal(Session(path).run({"x": x})["z"], [0, 1, 2])


def test_outputs_are_handed_over_in_c_order():
    """A conv kernel's channels-last result is an NCHW-shaped transposed view: as an output it
    is copied into C order (an output the caller owns is otherwise returned as is)."""
    channels_last = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4).transpose(0, 3, 1, 2)
    handed = session_module._owned(channels_last, {})
    assert handed.flags.c_contiguous and handed.flags.owndata
    np.testing.assert_array_equal(handed, channels_last)
    plain = np.ones((2, 3), np.float32)
    assert session_module._owned(plain, {}) is plain


def test_numpy_scalar_feeds_a_scalar_input(tmp_path):
    path = write_graph(
        tmp_path / "p.ferry",
        [node("n", "Neg", ["x"], ["y"])],
        [{"name": "x", "dtype": "float32", "shape": []}],
        ["y"],
    )
    assert Session(path).run({"x": np.float32(2.5)})["y"] == np.float32(-2.5)


# -- bad feeds --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        (
            {"img": images(1)},
            r"unknown input 'img' \(the model's inputs are \['image'\]\).*missing input 'image'",
        ),
        ({}, "missing input 'image'"),
        ({"image": images(1), "extra": images(1)}, "unknown input 'extra'"),
        ({"image": images(1).astype(np.float64)}, "input 'image' has dtype float64, expected float32"),
        ({"image": images(1)[0]}, r"input 'image' has shape \(3, 32, 32\) \(rank 3\), expected rank 4"),
        ({"image": images(1)[:, :, :31]}, r"expected \['N', 3, 32, 32\] \(dim 2 must be 32\)"),
        ({"image": images(1).tolist()}, "input 'image' must be a numpy.ndarray, got list"),
    ],
    ids=["wrong-name", "missing", "extra", "dtype", "rank", "fixed-dim", "not-an-array"],
)
def test_bad_feeds_are_named(classifier, feeds, message):
    with pytest.raises(InputError, match=message):
        Session(classifier[0]).run(feeds)


def test_feeds_must_be_a_mapping(classifier):
    with pytest.raises(InputError, match="feeds must be a dict"):
        Session(classifier[0]).run([images(1)])


def test_symbolic_dims_are_free_but_consistent(tmp_path):
    spec = {"dtype": "float32", "shape": ["N", 2]}
    path = write_graph(
        tmp_path / "p.ferry",
        [node("add", "Add", ["a", "b"], ["y"])],
        [{"name": "a", **spec}, {"name": "b", **spec}],
        ["y"],
    )
    session = Session(path)
    for n in (1, 4):
        ones = np.ones((n, 2), np.float32)
        assert session.run({"a": ones, "b": ones})["y"].shape == (n, 2)
    with pytest.raises(InputError, match=r"input 'b' dim 0 \('N'\) is 3, but input 'a' set 'N' to 2"):
        session.run({"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.float32)})


# -- bad graphs and packages ------------------------------------------------------------------


def test_unsupported_operators_are_all_listed_at_load(tmp_path):
    path = write_graph(
        tmp_path / "p.ferry",
        [
            node("first", "FancyOp", ["x"], ["a"]),
            node("fine", "Relu", ["a"], ["b"]),
            node("second", "OtherOp", ["b"], ["c"]),
            node("pool", "MaxPool", ["c"], ["d", "indices"], kernel_shape=[2]),
        ],
        [{"name": "x", "dtype": "float32", "shape": [1, 1, 4]}],
        ["d"],
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        Session(path)
    message = str(info.value)
    assert "3 node(s)" in message
    assert "node 'first': operator FancyOp is not supported" in message
    assert "node 'second': operator OtherOp is not supported" in message
    assert "node 'pool': the Indices output of MaxPool is not implemented" in message


def test_kernel_failure_names_node_op_and_shapes(tmp_path):
    path = write_graph(
        tmp_path / "p.ferry",
        [node("to_2x5", "Reshape", ["x", "shape"], ["y"])],
        [{"name": "x", "dtype": "float32", "shape": ["N", 10]}],
        ["y"],
        tensors={"shape": np.array([2, 5], np.int64)},
    )
    session = Session(path)
    assert session.run({"x": np.ones((1, 10), np.float32)})["y"].shape == (2, 5)
    with pytest.raises(NodeExecutionError) as info:
        session.run({"x": np.ones((3, 10), np.float32)})
    message = str(info.value)
    assert "node 'to_2x5' (Reshape) failed on inputs [x: float32[3, 10], shape: int64[2]]" in message
    assert "cannot reshape" in message


def test_graph_reading_an_undefined_value_is_rejected(tmp_path):
    path = write_graph(
        tmp_path / "p.ferry",
        [node("r", "Relu", ["nowhere"], ["y"])],
        [{"name": "x", "dtype": "float32", "shape": [2]}],
        ["y"],
    )
    with pytest.raises(PackageError, match="node 'r' \\(Relu\\) reads 'nowhere'"):
        Session(path)


def test_tampered_weight_byte_fails_integrity_check(classifier, tmp_path):
    data = bytearray(classifier[0].read_bytes())
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        weights = tar.getmember("weights.bin")
    data[weights.offset_data + 100] ^= 0x01
    tampered = tmp_path / "tampered.ferry"
    tampered.write_bytes(bytes(data))
    with pytest.raises(PackageIntegrityError, match="weights.bin does not match its sha256"):
        Session(tampered)


@pytest.mark.parametrize("keep", [0.5, 0.1, 0.0])
def test_truncated_archive_is_a_package_error(classifier, tmp_path, keep):
    data = classifier[0].read_bytes()
    truncated = tmp_path / "truncated.ferry"
    truncated.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(PackageError, match="truncated.ferry"):
        Session(truncated)


def _unpacked_with_manifest(package: Path, where: Path, **changes) -> Path:
    where.mkdir()
    with tarfile.open(package) as tar:
        tar.extractall(where, filter="data")
    manifest = json.loads((where / "manifest.json").read_text())
    (where / "manifest.json").write_text(json.dumps({**manifest, **changes}))
    return where


def test_packages_of_older_format_versions_still_run(classifier, tmp_path):
    """Packages already on devices keep loading after an engine update."""
    older = _unpacked_with_manifest(classifier[0], tmp_path / "v1", format_version=1)
    x = images(2)
    got, want = Session(older).run({"image": x}), Session(classifier[0]).run({"image": x})
    np.testing.assert_array_equal(got["probabilities"], want["probabilities"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format_version": FORMAT_VERSION + 1}, "newer than this engine reads .*update the engine"),
        ({"format_version": 0}, "unknown 'ferry-package' version 0"),
        ({"format_version": "2"}, "unknown 'ferry-package' version '2'"),
        ({"format": "tflite"}, "format 'tflite' is not a 'ferry-package'"),
    ],
)
def test_unreadable_format_versions_are_refused_with_a_reason(classifier, tmp_path, changes, message):
    package = _unpacked_with_manifest(classifier[0], tmp_path / "pkg", **changes)
    with pytest.raises(PackageError, match=message):
        Session(package)


def test_missing_package(tmp_path):
    with pytest.raises(PackageError, match="no such package"):
        Session(tmp_path / "nope.ferry")


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_threads_must_be_a_positive_int(classifier, threads):
    with pytest.raises(ValueError, match="threads"):
        Session(classifier[0], threads=threads)


# -- debug, profile, threads, planning --------------------------------------------------------


def test_ferry_debug_prints_every_node_input_and_output(plain_classifier, monkeypatch, capsys):
    session = Session(plain_classifier)
    session.run({"image": images(2)})
    session.run({"image": images(2)})  # planned: debug output must still cover every node
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("FERRY_DEBUG", "1")
    session.run({"image": images(2)})
    lines = capsys.readouterr().err.splitlines()
    outputs = [line for line in lines if " -> " in line]
    assert [line.split(" ")[1] for line in outputs] == NODES
    assert outputs[0].startswith("[ferry] conv1 (Conv) -> conv1: shape=(2, 8, 32, 32) dtype=float32 min=")
    assert "max=" in outputs[0]
    assert outputs[-1].startswith("[ferry] softmax (Softmax) -> probabilities: shape=(2, 10) dtype=float32")
    assert lines[0].startswith("[ferry] conv1 (Conv) <- image: shape=(2, 3, 32, 32) dtype=float32 min=")
    assert len(lines) == len(outputs) + sum(1 for line in lines if " <- " in line)


def test_profile_times_every_node_with_its_kernel(plain_classifier, monkeypatch):
    # the selector's kernels: a search would pick by timing, and on a noisy machine Winograd
    # has beaten im2col for conv1 (the search itself is tested in test_planner and below)
    monkeypatch.setenv("FERRY_KERNEL_SEARCH", "0")
    timings = Session(plain_classifier).profile({"image": images(2)})
    assert [t.node for t in timings] == NODES
    assert [t.op for t in timings][:3] == ["Conv", "Relu", "MaxPool"]
    assert timings[0].kernel == "conv.conv_im2col"
    # conv1's output dies at relu1 and nothing else shares its buffer: relu runs in place
    assert (timings[1].kernel, timings[1].note) == ("inplace.relu_inplace", "in place on conv1")
    assert (timings[-1].kernel, timings[-1].note) == ("inplace.softmax_inplace", "in place on logits")
    assert all(t.seconds >= 0 for t in timings)


def test_conv_kernel_variant_is_chosen_from_shapes(tmp_path):
    rng = np.random.default_rng(0)
    path = write_graph(
        tmp_path / "p.ferry",
        [
            node("pointwise", "Conv", ["x", "w1"], ["a"]),
            node("depthwise", "Conv", ["a", "w2"], ["b"], group=4, pads=[1, 1, 1, 1]),
        ],
        [{"name": "x", "dtype": "float32", "shape": [1, 2, 5, 5]}],
        ["b"],
        tensors={
            "w1": rng.standard_normal((4, 2, 1, 1)).astype(np.float32),
            "w2": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
        },
    )
    timings = Session(path).profile({"x": np.ones((1, 2, 5, 5), np.float32)})
    if jit.enabled():  # numpy's 1x1 GEMM and the JIT channels-last ones: measured
        assert timings[0].kernel in {
            "conv.conv_1x1",
            "conv.conv_1x1_jit",
            "conv.conv_1x1_gemm",
            "conv.conv_1x1_gemm8",
        }
    else:  # the only candidate: nothing to measure
        assert (timings[0].kernel, timings[0].note) == ("conv.conv_1x1", "")
    # depthwise has two numpy kernels (flat, channels-last), and two JIT ones where numba is
    # installed: all measured here, the fastest kept
    jit_kernels = {"conv.conv_depthwise_jit", "conv.conv_depthwise_jit_nhwc"} if jit.enabled() else set()
    assert timings[1].kernel in {
        "conv.conv_depthwise",
        "conv.conv_depthwise_flat",
        "conv.conv_depthwise_nhwc",
        *jit_kernels,
    }
    assert timings[1].note.startswith("searched: ")
    assert timings[1].kernel.split(".")[1] == timings[1].note.removeprefix("searched: ").split(" ")[0]
    # a later load of the same model on the same device reuses the choice without measuring
    again = Session(path).profile({"x": np.ones((1, 2, 5, 5), np.float32)})
    assert (again[1].kernel, again[1].note) == (timings[1].kernel, "searched, cached")


def test_kernel_search_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("FERRY_KERNEL_SEARCH", "0")
    rng = np.random.default_rng(0)
    path = write_graph(
        tmp_path / "p.ferry",
        [node("conv", "Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        [{"name": "x", "dtype": "float32", "shape": [1, 4, 6, 6]}],
        ["y"],
        tensors={"w": rng.standard_normal((4, 4, 3, 3)).astype(np.float32)},
    )
    timings = Session(path).profile({"x": np.ones((1, 4, 6, 6), np.float32)})
    assert [(t.kernel, t.note) for t in timings] == [("conv.conv_im2col", "")]


def test_one_plan_per_input_shape_signature(classifier):
    session = Session(classifier[0], threads=1)  # more threads run batch 2 as two planned batches of 1
    for batch in (1, 1, 2, 1, 2):
        session.run({"image": images(batch)})
    assert len(session._plans) == 2


def test_values_are_released_after_their_last_reader(plain_classifier):
    package = read_package(plain_classifier)
    program = compile_program(package.graph, package.tensors, "classifier")
    releases = {step.name: set(step.release) for step in program.steps}
    assert releases["relu1"] >= {"conv1"}  # conv1's output dies once relu1 has read it
    assert releases["conv1"] >= {"image", "conv1.weight", "conv1.bias"}
    released = [name for step in program.steps for name in step.release]
    assert len(released) == len(set(released))
    assert "probabilities" not in released
    produced = {o for step in program.steps for o in step.outputs} - {"probabilities"}
    assert produced <= set(released)


def test_threads_cap_the_blas_pool_during_the_run(tmp_path, monkeypatch):
    seen: list[int] = []

    def numpy_blas_threads() -> int:
        # numpy's BLAS only: a library loaded later (scipy's OpenBLAS, by numba) is not the engine's
        return max(pool["num_threads"] for pool in search_module._numpy_blas(threadpool_info()))

    def probe(inputs, attrs):
        seen.append(numpy_blas_threads())
        return [inputs[0]]

    monkeypatch.setitem(REGISTRY, "ThreadProbe", probe)
    path = write_graph(
        tmp_path / "p.ferry",
        [node("p", "ThreadProbe", ["x"], ["y"])],
        [{"name": "x", "dtype": "float32", "shape": [1]}],
        ["y"],
    )
    before = numpy_blas_threads()
    Session(path, threads=1).run({"x": np.ones(1, np.float32)})
    assert seen == [1]
    assert numpy_blas_threads() == before


def test_plan_cache_drops_the_least_recently_used_signature():
    from engine.plan import Plan, PlanCache

    cache = PlanCache(capacity=2)
    plans = [Plan(((f"x{i}", (i,)),), (), {}) for i in range(3)]
    cache.put(plans[0])
    cache.put(plans[1])
    assert cache.get(plans[0].signature) is plans[0]  # now the most recent
    cache.put(plans[2])
    assert len(cache) == 2
    assert cache.get(plans[1].signature) is None
    assert cache.get(plans[0].signature) is plans[0]
