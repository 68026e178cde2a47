"""The cores a chat request's kernels may use: ``serve-llm --threads``, ``FERRY_LLM_THREADS``,
else one; a bad value is refused with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import parser
from agent.llm_api.service import THREADS_ENV, LlmService
from agent.llm_api.standalone import open_package
from converter.llm.convert import convert_llm
from tests.engine.llm.checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm")
    write_checkpoint(root / "ckpt", "qwen2", max_position_embeddings=64)
    convert_llm(root / "ckpt", root / "tiny.ferry", weights="int8")
    return open_package(root / "tiny.ferry", tmp_path_factory.mktemp("unpacked"))


def test_the_threads_come_from_the_argument_the_environment_or_one(
    unpacked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert LlmService(unpacked).generator.threads == 1
    monkeypatch.setenv(THREADS_ENV, "2")
    assert LlmService(unpacked).generator.threads == 2
    assert LlmService(unpacked, threads=1).generator.threads == 1  # the argument wins
    for bad in ("two", "0", "-1"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ValueError, match="FERRY_LLM_THREADS must be a whole number of at least 1"):
            LlmService(unpacked)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        LlmService(unpacked, threads=0)


def test_serve_llm_takes_a_positive_thread_count(capsys: pytest.CaptureFixture) -> None:
    assert parser().parse_args(["serve-llm", "model.ferry", "--threads", "2"]).threads == 2
    assert parser().parse_args(["serve-llm", "model.ferry"]).threads is None
    with pytest.raises(SystemExit):
        parser().parse_args(["serve-llm", "model.ferry", "--threads", "0"])
    assert "must be a whole number of at least 1" in capsys.readouterr().err
