"""Decode on several threads, a token at a time (engine/llm/spread.py, spread_jit.py): the
one-thread path's logits and cache bit for bit, whatever number of workers run it, with the part
pool busy, and a waiting worker released by another thread (the kernels drop the GIL)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from converter.llm.convert import _int8_activations
from engine import batch_split, jit
from engine.llm import spread as llm_spread
from engine.llm import threads as llm_threads
from engine.llm.checkpoint import Checkpoint
from engine.llm.config import parse_config
from engine.llm.model import LlmModel, weights_from_checkpoint
from engine.llm.weights import make_matrix
from tests.engine.llm.checkpoints import config_dict, random_tensors

PROMPT = [5, 17, 42, 3, 99, 7, 250, 12, 64]
STEPS = 8
ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not jit.enabled(), reason="the spread decode is the JIT tier's")


def _model(precision: str, model_type: str = "llama", **extra: object) -> LlmModel:
    """What convert_llm stores: int8 activations, the dot layouts."""
    hf = config_dict(model_type, **extra)
    checkpoint = Checkpoint(directory=Path("."), config=parse_config(hf), tensors=random_tensors(hf, seed=5))
    weights = weights_from_checkpoint(checkpoint, precision, 32)
    _int8_activations(weights)
    return LlmModel(checkpoint.config, weights)


def _decode(model: LlmModel, threads: int, kind: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """Prefill, then STEPS greedy steps on ``threads`` threads: (every step's logits, the cache)."""
    with llm_threads.running_on(threads):
        cache = model.new_cache(kind=kind)
        logits = [model.forward(PROMPT, cache)]
        for _ in range(STEPS):
            logits.append(model.forward([int(np.argmax(logits[-1]))], cache))
    return np.array(logits), cache.data[:, :, :, : cache.length].copy()


@pytest.fixture(scope="module", autouse=True)
def _parallel_kernels() -> None:
    llm_threads.prepare(2)  # as serve-llm --threads 2 activates


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize(("model_type", "extra"), [("llama", {}), ("qwen2", {})])
def test_two_threads_decode_a_token_at_a_time_with_one_threads_logits_and_cache(
    precision: str, model_type: str, extra: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(precision, model_type, **extra)
    one_logits, one_cache = _decode(model, 1)
    tokens = []
    real = llm_spread.run_token

    def run_token(kernels, spread, fixed, threads):  # noqa: ANN001, ANN202
        tokens.append((kernels.__name__, threads))
        return real(kernels, spread, fixed, threads)

    monkeypatch.setattr(llm_spread, "run_token", run_token)
    two_logits, two_cache = _decode(model, 2)
    assert tokens == [("engine.llm.spread_jit", 2)] * STEPS  # every step spread over two workers
    with llm_threads.running_on(2):  # the LM head shared out too, as the token's last GEMV
        assert model._decode_buffers().spread.logits.shape == (model.config.vocab_size,)
    np.testing.assert_array_equal(two_logits, one_logits)
    np.testing.assert_array_equal(two_cache, one_cache)


@pytest.mark.parametrize("workers", [3, 5])
def test_any_number_of_workers_finishes_with_the_same_logits(workers: int) -> None:
    """More workers than cores (or than the part pool's threads: the caller runs the rest);
    none waits for one that has not started (a hang here would be the bug)."""
    model = _model("int8")
    one_logits, _ = _decode(model, 1)
    got, _ = _decode(model, workers)
    np.testing.assert_array_equal(got, one_logits)


def test_the_caller_runs_the_whole_token_while_the_part_pool_is_busy() -> None:
    """Another session holding every part-pool thread: the caller takes every worker's item
    itself and nothing waits for the pool."""
    model = _model("int4")
    one_logits, _ = _decode(model, 1)
    release = threading.Event()
    pool = batch_split._workers()
    busy = [pool.submit(release.wait) for _ in range(pool._max_workers)]
    try:
        got, _ = _decode(model, 2)
    finally:
        release.set()
    assert all(future.result() for future in busy)
    np.testing.assert_array_equal(got, one_logits)


def test_a_waiting_worker_is_released_by_another_python_thread() -> None:
    """``token_work`` runs with the GIL released: a worker spinning on a GEMV no one opened
    goes on once a Python thread marks the token done.  Held, it would never return (hence a
    subprocess with a timeout)."""
    _spin_until_released(aot=False)


def _spin_until_released(aot: bool) -> None:
    script = (
        "import threading, time\n"
        "import numpy as np\n"
        "from tests.engine.llm.test_decode_spread import _model\n"
        "from engine.llm import threads as llm_threads\n"
        "model = _model('int4')\n"
        "with llm_threads.running_on(2):\n"
        "    fused = model._decode_buffers()\n"
        "    spread, kernels = fused.spread, fused.spread_kernels\n"
        "state = spread.state\n"
        "state[:] = 0  # nothing opened: a worker spins on the first GEMV\n"
        "def finish():\n"
        "    time.sleep(0.2)\n"
        "    state[:-1] = 1 << 40  # every vector claimed\n"
        "    state[-1] = 1 << 40  # every GEMV open\n"
        "threading.Thread(target=finish).start()\n"
        "c = model.config\n"
        "half = c.head_dim // 2\n"
        "rope = (np.ones(half, np.float32), np.zeros(half, np.float32), c.num_kv_heads, 0, 1.0)\n"
        "buffers = (fused.x, fused.a, fused.q, *fused.scratch, spread.logits)\n"
        "cache = model.new_cache()\n"
        "kernels.token_work(spread.matrices, spread.like, spread.floats, 1e-5, rope, cache.data, buffers,"
        " spread.scratch, state)\n"
        "print(type(kernels).__name__)\n"
    )
    env = dict(os.environ, FERRY_LLM_AOT="1" if aot else "0", FERRY_JIT_CACHE=str(jit.cache_dir()))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "platform"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == ("AotKernels" if aot else "module")


def test_an_int8_cache_and_other_layouts_keep_the_one_call_layers() -> None:
    model = _model("int8")
    one_logits, one_cache = _decode(model, 1, "int8")
    two_logits, two_cache = _decode(model, 2, "int8")
    np.testing.assert_array_equal(two_logits, one_logits)
    np.testing.assert_array_equal(two_cache, one_cache)
    hf = config_dict("llama")
    checkpoint = Checkpoint(directory=Path("."), config=parse_config(hf), tensors=random_tensors(hf, seed=5))
    plain = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint, "fp32", 32))
    with llm_threads.running_on(2):
        assert plain._decode_buffers().spread is None


def test_an_lm_head_of_another_kind_runs_after_the_shared_layers() -> None:
    """A float LM head beside int4 layers: the layers are shared out, the head is not (the
    tables hold one kind), and the logits are still one thread's."""
    model = _model("int4")
    hf = config_dict("llama")
    embed = random_tensors(hf, seed=5)["model.embed_tokens.weight"]
    model.weights.lm_head = make_matrix(np.asarray(embed, np.float32), "fp32")
    one_logits, _ = _decode(model, 1)
    two_logits, _ = _decode(model, 2)
    with llm_threads.running_on(2):
        spread = model._decode_buffers().spread
    assert spread is not None and spread.logits.size == 0
    np.testing.assert_array_equal(two_logits, one_logits)
