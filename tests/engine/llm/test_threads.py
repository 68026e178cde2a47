"""An LLM's kernels on several threads (engine/llm/threads.py): numba's pool gets them and
OpenBLAS one (without the JIT tier, BLAS gets them), and the tokens are those of one thread."""

from __future__ import annotations

from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

from engine import jit
from engine.llm import threads as llm_threads
from engine.llm.checkpoint import load_checkpoint
from engine.llm.generate import Generator
from engine.llm.model import LlmModel, weights_from_checkpoint
from engine.llm.sampler import SamplingOptions
from engine.llm.tokenizer import LlmTokenizer
from tests.engine.llm.checkpoints import write_checkpoint


def _numpy_blas_threads() -> int:
    return min(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


@pytest.mark.skipif(not jit.enabled(), reason="the JIT tier is off")
def test_with_the_jit_tier_numba_gets_the_threads_and_blas_one() -> None:
    before = _numpy_blas_threads()
    with llm_threads.running_on(2):
        assert jit.threads() == 2
        assert _numpy_blas_threads() == 1
    assert jit.threads() == 1 and _numpy_blas_threads() == before


def test_without_the_jit_tier_blas_gets_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_threads.jit, "enabled", lambda: False)
    with llm_threads.running_on(2):
        assert _numpy_blas_threads() == 2


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_two_threads_generate_one_threads_tokens(
    tmp_path: Path, precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_checkpoint(tmp_path, "llama", max_position_embeddings=64)
    checkpoint = load_checkpoint(tmp_path)
    model = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint, precision, 32))
    tokenizer = LlmTokenizer.from_directory(tmp_path)
    if jit.enabled():  # the tiny model's GEMVs spread too (dot_jit.spread_gemv)
        monkeypatch.setattr(jit.module("engine.llm.dot_jit"), "PARALLEL_MIN_WEIGHTS", 0)
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11]
    runs = {}
    for threads in (1, 2):
        generator = Generator(model, tokenizer, threads=threads)
        runs[threads] = generator.generate(prompt, max_tokens=6, options=SamplingOptions(temperature=0))
    assert len(runs[1].tokens) == 6
    assert runs[2].tokens == runs[1].tokens
