"""Decode on several threads in one parallel region per token (engine/llm/spread_jit.py): the
one-thread path's logits and cache bit for bit, whatever number of workers numba runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from converter.llm.convert import _int8_activations
from engine import jit
from engine.llm import threads as llm_threads
from engine.llm.checkpoint import Checkpoint
from engine.llm.config import parse_config
from engine.llm.model import LlmModel, weights_from_checkpoint
from tests.engine.llm.checkpoints import config_dict, random_tensors

PROMPT = [5, 17, 42, 3, 99, 7, 250, 12, 64]
STEPS = 8
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
def test_two_threads_decode_in_one_region_gives_one_threads_logits_and_cache(
    precision: str, model_type: str, extra: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(precision, model_type, **extra)
    one_logits, one_cache = _decode(model, 1)
    regions = []
    real_run = jit.run

    def run(serial, parallel, *args):  # noqa: ANN001, ANN202
        if parallel.py_func.__name__ == "token_parallel":
            regions.append((jit.threads(), args[-1], jit._parallel.locked()))
        return real_run(serial, parallel, *args)

    monkeypatch.setattr(jit, "run", run)
    two_logits, two_cache = _decode(model, 2)
    assert regions == [(2, 2, False)] * STEPS  # every step one region of two workers, pool free
    with llm_threads.running_on(2):
        assert model._decode_buffers().spread is not None
    np.testing.assert_array_equal(two_logits, one_logits)
    np.testing.assert_array_equal(two_cache, one_cache)


@pytest.mark.parametrize("workers", [3, 5])
def test_any_number_of_workers_finishes_with_the_same_logits(workers: int) -> None:
    """More workers than numba's threads run one after another on a thread; none waits for one
    that has not started (a hang here would be the bug)."""
    model = _model("int8")
    one_logits, _ = _decode(model, 1)
    got, _ = _decode(model, workers)  # numba runs min(workers, its threads); prange(workers)
    np.testing.assert_array_equal(got, one_logits)


def test_the_region_runs_serially_when_numbas_pool_is_taken() -> None:
    """Another session holding the pool: the one-call layers run the token, the same logits."""
    model = _model("int4")
    one_logits, _ = _decode(model, 1)
    with jit._parallel:  # what a concurrent parallel kernel holds
        got, _ = _decode(model, 2)
    np.testing.assert_array_equal(got, one_logits)


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
