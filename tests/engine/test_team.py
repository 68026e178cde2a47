"""The team (engine/team.py, engine/ops/team_jit.py): a worker thread spinning through a
2-thread run and taking a share of each conv GEMM (and of a transformer's GEMMs, row softmax
and GELU).  Shared GEMMs must equal the serial kernel
bit for bit whether or not the worker joins; a 2-thread session must run its GEMMs with the
team and give its 1-thread results; two sessions at once must both stay right; and a process
that used the team must exit (and fork) cleanly.  Skipped without numba or with FERRY_JIT=0."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("numba")

from engine import Session, jit, team  # noqa: E402
from engine import plan_threads as pt  # noqa: E402
from engine.search import KernelSearch  # noqa: E402
from tests.engine.helpers import write_model_package  # noqa: E402

if not jit.enabled():
    pytest.skip("the JIT tier is turned off (FERRY_JIT=0)", allow_module_level=True)

gemm8_jit = jit.module("engine.ops.conv.gemm8_jit")
gemm_jit = jit.module("engine.ops.conv.gemm_jit")
ROOT = Path(__file__).resolve().parents[2]


def _job(kind: int, rows: int, depth: int, m: int, residual: bool, clip: bool, seed: int):
    """The GEMM kernel's arguments for a (rows, depth) @ (depth, m) product split for several
    threads: gemm8_jit's (team.GEMM8, 16-wide panels) or gemm_jit's (GEMM32, 32-wide)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(rows * depth).astype(np.float32)
    w = rng.standard_normal((depth, m)).astype(np.float32)
    if kind == team.GEMM8:
        packed, width, block = (
            gemm8_jit.pack_panels16(w),
            gemm8_jit.NR,
            gemm8_jit.block_rows16(rows, depth, True),
        )
    else:
        packed, width, block = (
            gemm_jit.pack_panels(w),
            gemm_jit.NR,
            gemm_jit.block_rows_for(rows, depth, True),
        )
    bias = np.zeros(-(-m // width) * width, np.float32)
    bias[:m] = rng.standard_normal(m)
    res = rng.standard_normal(rows * m).astype(np.float32) if residual else np.zeros(1, np.float32)
    items = -(-rows // block) * -(-m // width)
    lo, hi = np.float32(-0.5), np.float32(0.75)
    arrays = [x, packed.reshape(-1), np.full(rows * m, np.nan, np.float32), bias, res, residual, clip, lo, hi]
    return arrays, (rows, depth, m, m, block, 0, items)


@pytest.mark.parametrize("kind", [team.GEMM8, team.GEMM32])
@pytest.mark.parametrize(
    ("rows", "depth", "m", "residual", "clip"),
    [
        (3136, 16, 96, True, True),
        (196, 576, 96, False, True),
        (49, 960, 160, True, False),
        (7, 37, 24, False, False),
    ],
)
def test_a_shared_gemm_is_the_serial_kernel_bit_for_bit(kind, rows, depth, m, residual, clip):
    arrays, geometry = _job(kind, rows, depth, m, residual, clip, seed=rows + m)
    serial = gemm8_jit._items16 if kind == team.GEMM8 else gemm_jit._gemm_items
    want = arrays[2].copy()
    serial(*arrays[:2], want, *arrays[3:], *geometry)
    shared = team.shared()
    before = _jobs()
    with shared.running() as running:
        assert running
        for _ in range(20):  # many jobs: the worker joins some, at whatever point it gets there
            arrays[2][:] = np.nan
            shared.share(kind, *arrays, *geometry)
            assert np.array_equal(arrays[2], want)
    assert _jobs() - before == 20
    arrays[2][:] = np.nan  # no run: the worker sleeps, and the caller takes every item alone
    shared.share(kind, *arrays, *geometry)
    assert np.array_equal(arrays[2], want)


def _jobs() -> int:
    """The jobs the process's team has opened so far (its tag counts them)."""
    shared = team.shared()
    return int(shared._state[shared._kernels.TAG])


def _in_a_team_run(call):  # noqa: ANN001, ANN202
    """``call()`` as a 2-thread session's team run makes it (the worker spinning, numba's pool
    closed): its result and the jobs it opened."""
    before = _jobs()
    with team.shared().running(), jit.pool_closed(), jit.thread_limit(2):
        result = call()
    return result, _jobs() - before


def test_a_shared_softmax_is_the_serial_kernel_bit_for_bit():
    """Attention's row softmax is a team job too (by rows): the serial kernel's results."""
    attention_jit = jit.module("engine.ops.attention_jit")
    rows = np.random.default_rng(4).standard_normal((3 * 197, 197)).astype(np.float32) * 8
    want = attention_jit.softmax_rows_into(rows.copy(), 1.0)
    got, jobs = _in_a_team_run(lambda: attention_jit.softmax_rows_into(rows.copy(), 1.0))
    assert jobs == 1
    assert np.array_equal(got, want)


@pytest.mark.parametrize("with_bias", [False, True])
def test_a_shared_gelu_is_the_serial_kernel_bit_for_bit(with_bias):
    """A feed-forward's exact GELU (a plain one, and FusedMatMul's after its shared GEMM) is a
    team job by rows: the serial kernel's results, edge values included; a small one stays on
    the caller."""
    rows_jit = jit.module("engine.ops.rows_jit")
    rng = np.random.default_rng(7)
    y = (rng.standard_normal((197, 768)) * 4).astype(np.float32)
    y[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    bias = rng.standard_normal(768).astype(np.float32) if with_bias else None
    want = rows_jit.gelu_rows_into(y.copy(), bias)
    got, jobs = _in_a_team_run(lambda: rows_jit.gelu_rows_into(y.copy(), bias))
    assert jobs == 1
    np.testing.assert_array_equal(got, want)
    small = y[:8, :64].copy()
    got, jobs = _in_a_team_run(lambda: rows_jit.gelu_rows_into(small.copy(), None))
    assert jobs == 0
    np.testing.assert_array_equal(got, rows_jit.gelu_rows_into(small.copy(), None))


@pytest.mark.parametrize("stride", [1, 2])
def test_a_shared_depthwise_conv_is_the_serial_kernel_bit_for_bit(stride):
    """A 3x3 depthwise conv is a team job by output rows (with its residual and Clip): the
    serial kernel's results, in one job."""
    vec = jit.module("engine.ops.conv.depthwise_vec_jit")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 48, 53, 41)).astype(np.float32)  # past team.MIN_MACS at stride 2
    w = rng.standard_normal((48, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    attrs = {"group": 48, "kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "strides": [stride, stride]}
    attrs |= {"activation": "Clip", "activation_attrs": {"min": -1.0, "max": 2.0}}
    want = vec.conv_depthwise_jit_vec([x, w, b], attrs)[0]
    residual = rng.standard_normal(want.shape).astype(np.float32)
    want = vec.conv_depthwise_jit_vec([x, w, b, residual], attrs)[0]
    got, jobs = _in_a_team_run(lambda: vec.conv_depthwise_jit_vec([x, w, b, residual], attrs)[0])
    assert jobs == 1
    assert np.array_equal(got, want)


@pytest.mark.parametrize("split", [False, True])
def test_a_shared_direct_conv_is_the_serial_kernel_bit_for_bit(split):
    """A stem's implicit-GEMM conv (6 x 32 tiles, or 6 x 16 when ``split``) is a team job by
    output rows, with its residual and Clip, rows and channels not whole tiles: the serial
    kernel's results, in one job; a small one stays on the caller."""
    direct = jit.module("engine.ops.conv.direct_jit")
    conv = direct.conv_direct_jit8 if split else direct.conv_direct_jit
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 61, 47)).astype(np.float32)
    w = rng.standard_normal((40, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 0, 1, 2], "strides": [2, 2]}
    attrs |= {"activation": "Clip", "activation_attrs": {"min": -1.0, "max": 2.0}}
    residual = rng.standard_normal(conv([x, w, b], attrs)[0].shape).astype(np.float32)
    want = conv([x, w, b, residual], attrs)[0]
    got, jobs = _in_a_team_run(lambda: conv([x, w, b, residual], attrs)[0])
    assert jobs == 1
    assert np.array_equal(got, want)
    small = x[:1, :, :9, :9]
    got, jobs = _in_a_team_run(lambda: conv([small, w, b], attrs)[0])
    assert jobs == 0
    assert np.array_equal(got, conv([small, w, b], attrs)[0])


@pytest.mark.parametrize("kernel", ["conv_winograd_gemm", "conv_winograd4_gemm"])
def test_shared_winograd_transforms_are_the_serial_kernels_bit_for_bit(kernel):
    """Winograd's input and output tile transforms (with bias, residual and Clip) are team jobs by
    rows of tiles, beside its slot GEMM: the serial kernel's results, in three jobs; a small
    conv's transforms stay on the caller."""
    wino = jit.module("engine.ops.conv.winograd_jit")
    conv = getattr(wino, kernel)
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 40, 29, 23)).astype(np.float32)
    w = rng.standard_normal((48, 40, 3, 3)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    attrs |= {"activation": "Clip", "activation_attrs": {"min": -1.0, "max": 2.0}}
    residual = rng.standard_normal((1, 48, 29, 23)).astype(np.float32)
    with jit.thread_limit(1):
        want = conv([x, w, b, residual], attrs)[0]
    got, jobs = _in_a_team_run(lambda: conv([x, w, b, residual], attrs)[0])
    assert jobs == 3  # input transform, slot products, output transform
    assert np.array_equal(got, want)
    small = x[:, :8, :6, :6]
    got, jobs = _in_a_team_run(lambda: conv([small, w[:, :8], b], attrs)[0])
    assert jobs == 0
    with jit.thread_limit(1):
        assert np.array_equal(got, conv([small, w[:, :8], b], attrs)[0])


def test_a_shared_classifier_gemv_is_the_serial_kernel_bit_for_bit():
    """A CNN's classifier (a one-row Gemm by B^T, gemv_jit) is a team job by blocks of outputs:
    the serial kernel's results, in one job; a small one stays on the caller."""
    gemv = jit.module("engine.ops.gemv_jit")
    rng = np.random.default_rng(9)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((1, 1280), (1001, 1280), (1001,)))
    with jit.thread_limit(1):
        want = gemv.gemv_jit([a, b, c], {"transB": 1})[0]
    got, jobs = _in_a_team_run(lambda: gemv.gemv_jit([a, b, c], {"transB": 1})[0])
    assert jobs == 1
    assert np.array_equal(got, want)
    got, jobs = _in_a_team_run(lambda: gemv.gemv_jit([a[:, :64], b[:50, :64]], {"transB": 1})[0])
    assert jobs == 0
    assert np.array_equal(got, gemv.gemv_jit([a[:, :64], b[:50, :64]], {"transB": 1})[0])


def test_the_caller_claims_a_job_from_its_front_and_the_worker_from_its_back():
    """Each thread keeps the same end of every job (the rows it wrote in the layer before), a
    quarter of what is left a claim, until the two meet: every item run once."""
    kernels, gemv = jit.module(team.MODULE), jit.module("engine.ops.gemv_jit")
    rng = np.random.default_rng(11)
    depth, blocks = 64, 40
    n = blocks * gemv.BLOCK
    x, b = rng.standard_normal(depth).astype(np.float32), rng.standard_normal((n, depth)).astype(np.float32)
    bias, out = np.zeros(n, np.float32), np.full(n, np.nan, np.float32)
    state, table = np.zeros(kernels.STATE_SLOTS, np.int64), np.zeros((kernels.TABLE_ROWS, 2), np.int64)
    for row, array in enumerate((x, b, bias, out)):
        table[row] = array.ctypes.data, array.size
    table[kernels.FLAGS] = 0, team.GEMV
    table[kernels.INTS] = depth, n
    bits, mask = team.ITEM_BITS, (1 << team.ITEM_BITS) - 1
    state[kernels.NEXT] = (7 << (2 * bits)) | (blocks << bits)  # job 7: items [0, 40) open

    def done_blocks() -> list[int]:
        return [i for i in range(blocks) if not np.isnan(out[i * gemv.BLOCK])]

    assert kernels._claim(state, table, np.zeros(2, np.float32), True)  # the worker: 40 // 4 = 10
    assert done_blocks() == list(range(30, 40))
    assert kernels._claim(state, table, np.zeros(2, np.float32), False)  # the caller: 30 // 4 = 7
    assert done_blocks() == [*range(7), *range(30, 40)]
    word = int(state[kernels.NEXT])
    assert (word >> (2 * bits), (word >> bits) & mask, word & mask) == (7, 30, 7)
    turn = True
    while kernels._claim(state, table, np.zeros(2, np.float32), turn):
        turn = not turn
    assert done_blocks() == list(range(blocks))
    assert state[kernels.DONE] == blocks
    np.testing.assert_allclose(out, b @ x, rtol=1e-5, atol=1e-4)


def test_a_job_too_large_for_the_claim_word_runs_serially():
    """A job's items are counted in team.ITEM_BITS bits: a larger one runs on the caller alone."""
    attention_jit = jit.module("engine.ops.attention_jit")
    rows = np.random.default_rng(5).standard_normal((team.MAX_ITEMS, 2)).astype(np.float32)
    want = attention_jit.softmax_rows_into(rows.copy(), 1.0)
    got, jobs = _in_a_team_run(lambda: attention_jit.softmax_rows_into(rows.copy(), 1.0))
    assert jobs == 0
    assert np.array_equal(got, want)


def _pointwise_model(seed: int):
    """x -> 1x1 conv (64 -> 96) + Relu -> depthwise 3x3 -> 1x1 conv (96 -> 64) + x -> 1x1 conv: a
    MobileNet block and the next one's first conv (the depthwise conv brings the JIT tier in,
    and with it the GEMMs' JIT kernels; four convs make it a convnet for team.wanted)."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((96, 64, 1, 1)).astype(np.float32) * 0.2,
        "b1": rng.standard_normal(96).astype(np.float32) * 0.1,
        "wd": rng.standard_normal((96, 1, 3, 3)).astype(np.float32) * 0.3,
        "w2": rng.standard_normal((64, 96, 1, 1)).astype(np.float32) * 0.2,
        "w3": rng.standard_normal((64, 64, 1, 1)).astype(np.float32) * 0.2,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Conv", ["r", "wd"], ["d"], group=96, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d", "w2"], ["p"]),
        helper.make_node("Add", ["p", "x"], ["s"]),
        helper.make_node("Conv", ["s", "w3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 40, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 40, 40])],
        initializer=[numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, 64, 40, 40)).astype(np.float32)}


@pytest.fixture
def team_kernels(monkeypatch, tmp_path):
    """The kernel search picks the kernels that share work with the team (gemm8_jit's GEMM,
    matmul_jit's) wherever they are candidates: which kernel wins on this CPU is not what these tests are
    about."""
    monkeypatch.setenv("FERRY_KERNEL_CACHE", str(tmp_path / "kernels"))

    def measure(self, candidates, attrs, inputs, node, evict=None):  # noqa: ANN001, ANN202, ARG001
        shared = ("conv_1x1_gemm8", "fused_matmul_gemm_jit", "matmul_gemm_jit")
        return next((k for k in candidates if k.__name__.endswith(shared)), candidates[0]), "test"

    monkeypatch.setattr(KernelSearch, "_measure", measure)


def test_a_two_thread_session_runs_its_conv_gemms_with_the_team(tmp_path, team_kernels, monkeypatch):
    """...and its first run (recorded) on one thread: OpenBLAS's threads, spinning for ~0.1 s
    after it, would take the worker's core through the first planned runs."""
    model, feeds = _pointwise_model(1)
    package = write_model_package(model, tmp_path / "block.ferry", feeds)
    one = Session(package, threads=1)
    want = [one.run(feeds)["y"].copy() for _ in range(3)][-1]  # the planned run's
    entered, threads = [], Session._threads
    monkeypatch.setattr(Session, "_threads", lambda *args: entered.append(args[1:]) or threads(*args))
    session = Session(package, threads=2)
    before = _jobs()
    for _ in range(2 + 2 * pt.FIRST_SAMPLES + 2):  # record, plan, then both thread counts sampled
        # the first run (recorded, before any plan) is on numpy's kernels: the same to rounding
        np.testing.assert_allclose(session.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)
    (choice,) = session._thread_choices.values()
    assert len(choice.times[2]) >= pt.FIRST_SAMPLES
    assert _jobs() - before >= 3 * pt.FIRST_SAMPLES  # three GEMMs a run
    assert [plan.team for plan in session._plans._plans.values()] == [True]
    assert entered[:2] == [(1, False), (2, True)]  # recorded on one thread, planned with the team


def _products_model(rows: int, seed: int):
    """x (1, rows, 96) through four products by fixed weights with biases and a Relu, and a
    residual Add: a transformer's feed-forward shapes, without attention."""
    rng = np.random.default_rng(seed)
    sizes = [96, 192, 128, 160, 96]
    inits, nodes, value = {}, [], "x"
    for i, (k, m) in enumerate(zip(sizes, sizes[1:], strict=False)):
        inits[f"w{i}"] = rng.standard_normal((k, m)).astype(np.float32) * 0.1
        inits[f"b{i}"] = rng.standard_normal(m).astype(np.float32) * 0.1
        nodes += [
            helper.make_node("MatMul", [value, f"w{i}"], [f"p{i}"]),
            helper.make_node("Add", [f"p{i}", f"b{i}"], [f"a{i}"]),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"]),
        ]
        value = f"r{i}"
    nodes.append(helper.make_node("Add", [value, "x"], ["y"]))
    shape = [1, rows, 96]
    graph = helper.make_graph(
        nodes,
        "products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("rows, with_team", [(200, True), (1, False)])
def test_a_transformers_products_share_with_the_team_and_a_decode_steps_do_not(
    tmp_path, team_kernels, rows, with_team
):
    """Products by fixed weights over many rows (a transformer's) are the team's GEMMs, so such
    a run holds OpenBLAS at one thread and shares them; a decode step's one-row products
    (GEMVs, not the team's) keep OpenBLAS's threads.  Both give the 1-thread results."""
    jit.module("engine.ops.matmul_jit")  # as a transformer's attention brings it in (jit_needs)
    model, feeds = _products_model(rows, 3)
    package = write_model_package(model, tmp_path / "products.ferry", feeds)
    want = [Session(package, threads=1).run(feeds)["y"] for _ in range(3)][-1]
    session = Session(package, threads=2)
    before = _jobs()
    for _ in range(2 + 2 * pt.FIRST_SAMPLES + 2):
        np.testing.assert_allclose(session.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)
    assert [plan.team for plan in session._plans._plans.values()] == [with_team]
    jobs = _jobs() - before
    assert jobs >= 4 * pt.FIRST_SAMPLES if with_team else jobs == 0


def test_two_sessions_running_at_once_both_stay_right(tmp_path, team_kernels):
    """One run holds the team; the other, at the same moment, runs its kernels as before."""
    model, feeds = _pointwise_model(2)
    package = write_model_package(model, tmp_path / "block.ferry", feeds)
    want = [Session(package, threads=1).run(feeds)["y"] for _ in range(1)][0]
    sessions = [Session(package, threads=2) for _ in range(2)]
    wrong: list[float] = []

    def drive(session: Session) -> None:
        for _ in range(15):
            wrong.append(float(np.abs(session.run(feeds)["y"] - want).max()))

    threads = [threading.Thread(target=drive, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(wrong) == 30 and max(wrong) <= 1e-4


def test_a_process_that_used_the_team_exits_and_forks_cleanly(tmp_path):
    """The worker is stopped at exit (compiled code running through the interpreter's teardown
    crashed a prototype), and a forked child makes a team of its own."""
    script = (
        "import os\n"
        "import numpy as np\n"
        "from engine import jit, team\n"
        "g = jit.module('engine.ops.conv.gemm8_jit')\n"
        "def job():\n"
        "    x = np.ones(300 * 40, np.float32)\n"
        "    packed = g.pack_panels16(np.ones((40, 32), np.float32)).reshape(-1)\n"
        "    out = np.zeros(300 * 32, np.float32)\n"
        "    args = [x, packed, out, np.zeros(32, np.float32), np.zeros(1, np.float32), False, False,\n"
        "            np.float32(0), np.float32(0), 300, 40, 32, 32, 60, 0, 10]\n"
        "    with team.shared().running():\n"
        "        team.shared().share(team.GEMM8, *args)\n"
        "    assert (out == 40).all()\n"
        "job()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    job()\n"
        "    os._exit(0)\n"
        "assert os.waitpid(pid, 0)[1] == 0\n"
        "print('ok')\n"
    )
    env = {
        **os.environ,
        "FERRY_JIT_CACHE": os.environ.get("FERRY_JIT_CACHE", str(tmp_path / "jit")),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_run_is_the_teams_with_four_shared_products():
    """Convs, and products by fixed 2-D weights over MIN_ROWS rows or more, are the team's
    GEMMs; four of them make a run the team's, on two threads or more.  A product by a value
    computed in the run (attention's), or over fewer rows (a decode step), is not."""
    from types import SimpleNamespace  # noqa: PLC0415

    jit.module("engine.ops.matmul_jit")  # the products' GEMM kernels, as a transformer loads them

    def step(op: str, *inputs: str) -> SimpleNamespace:
        return SimpleNamespace(op=op, inputs=list(inputs))

    shapes = {"x": (1, 64, 32, 32), "wc": (8, 64, 1, 1), "a": (1, 128, 384), "w": (384, 384)}
    shapes |= {"t": (1, 384, 128), "one": (1, 1, 384)}
    record = SimpleNamespace(
        info={name: SimpleNamespace(shape=shape) for name, shape in shapes.items()},
        static={"wc": None, "w": None},
    )
    convnet = [step("Conv", "x", "wc"), step("FusedConv", "x", "wc"), step("Conv", "x", "wc")]
    convnet += [step("Conv", "x", "wc"), step("Add", "x", "x")]
    products = [step("FusedMatMul", "a", "w") for _ in range(3)] + [step("MatMul", "a", "w")]
    assert team.wanted(2, convnet, record) and team.wanted(2, products, record)
    assert not team.wanted(1, convnet, record)
    assert not team.wanted(2, convnet, None)  # a signature's first run: nothing recorded yet
    assert not team.wanted(2, products[:3] + [step("MatMul", "a", "t")], record)  # t: computed
    assert not team.wanted(2, [step("FusedMatMul", "one", "w")] * 4, record)
    assert team.wanted(2, products[:3] + [step("Conv", "x", "wc")], record)
