"""The model's tokenizer through Hugging Face's ``tokenizers`` library (tokenizer.json), plus the
chat template and special tokens from tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.llm.errors import TokenizerError


class LlmTokenizer:
    def __init__(self, tokenizer: Any, config: dict[str, Any] | None = None) -> None:
        self._tokenizer = tokenizer
        self.config = config or {}

    @classmethod
    def from_directory(cls, directory: str | Path) -> LlmTokenizer:
        """tokenizer.json (required) and tokenizer_config.json (optional) of a directory."""
        try:
            from tokenizers import Tokenizer  # noqa: PLC0415 - only LLM packages need it
        except ImportError as exc:
            raise TokenizerError(
                "the `tokenizers` library is not installed (requirements-agent.lock)"
            ) from exc
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{path}: missing (the model's tokenizer)")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exception on a malformed file
            raise TokenizerError(f"{path}: not a readable tokenizer ({exc})") from exc
        config_path = directory / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise TokenizerError(f"{config_path}: not readable JSON ({exc})") from exc
        return cls(tokenizer, config if isinstance(config, dict) else {})

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce (added tokens included)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self) -> str | None:
        template = self.config.get("chat_template")
        return template if isinstance(template, str) else None

    def check_fits(self, embedding_rows: int) -> None:
        """Refuse a tokenizer that can produce ids past the embedding's rows."""
        largest = max(self._tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
        if largest >= embedding_rows:
            raise TokenizerError(
                f"tokenizer.json has token id {largest}, past the embedding's {embedding_rows} rows "
                "(vocab_size in config.json); the tokenizer does not belong to these weights"
            )

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)
