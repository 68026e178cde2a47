"""The CLIP tokenizer (engine/diffusion/tokenizer.py) against transformers' CLIPTokenizer on the
tiny vocabulary, and from the tokenizer.json a package stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.diffusion.errors import DiffusionPackageError
from engine.diffusion.tokenizer import ClipTokenizer, load_package_tokenizer
from tests.engine.diffusion import tiny

PROMPTS = ["a cat", "A  RED Ferry, on the sea!", "", "the boat's 3 cats", "ferry " * 20, "café ☕"]


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    for name, text in tiny.tokenizer_files().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_pads_and_truncates_like_clip(directory: Path) -> None:
    tokenizer = ClipTokenizer.from_directory(directory)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        assert len(ids) == tiny.MAX_LENGTH and ids[0] == tokenizer.bos
        assert tokenizer.eos in ids
    assert tokenizer.encode("ferry")[1] != tokenizer.encode("f")[1]  # merged into one token


def test_matches_transformers(directory: Path) -> None:
    transformers = pytest.importorskip("transformers")
    theirs = transformers.CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=tiny.MAX_LENGTH
    )
    ours = ClipTokenizer.from_directory(directory)
    for prompt in PROMPTS:
        assert ours.encode(prompt) == theirs(prompt, padding="max_length", truncation=True).input_ids, prompt


def test_round_trips_through_tokenizer_json(
    directory: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ours = ClipTokenizer.from_directory(directory)
    stored = tmp_path_factory.mktemp("package") / "tokenizer.json"
    stored.write_text(ours.to_json(), encoding="utf-8")
    again = load_package_tokenizer(stored, **ours.settings())
    assert [again.encode(p) for p in PROMPTS] == [ours.encode(p) for p in PROMPTS]


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DiffusionPackageError, match="vocab.json and merges.txt"):
        ClipTokenizer.from_directory(tmp_path)
