"""The text encoder's tokenizer: CLIP's byte-level BPE through Hugging Face's ``tokenizers``.

diffusers' layout keeps CLIP's slow-tokenizer files (``vocab.json``, ``merges.txt``,
``tokenizer_config.json``); some exports add a ``tokenizer.json``.  ``from_directory`` takes
either and builds the same pipeline as transformers' CLIP converter (NFC, whitespace collapsed,
lower case, CLIP's word regex, byte-level, ``</w>`` ending each word), so ``to_json()`` gives
the one file a package needs.  Prompts are encoded as CLIPTokenizer with
``padding="max_length", truncation=True`` does: start token, at most ``max_length - 2`` tokens,
end token, then the pad token up to ``max_length``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.diffusion.errors import DiffusionPackageError

BOS, EOS = "<|startoftext|>", "<|endoftext|>"
CLIP_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
DEFAULT_MAX_LENGTH = 77
UNSET_LENGTH = 1_000_000  # transformers writes a huge model_max_length when none was set


def _library() -> Any:
    try:
        import tokenizers  # noqa: PLC0415 - only diffusion and LLM packages need it
    except ImportError as exc:
        raise DiffusionPackageError(
            "the `tokenizers` library is not installed (requirements-agent.lock)"
        ) from exc
    return tokenizers


def _from_vocab(directory: Path) -> Any:
    """CLIP's pipeline over vocab.json and merges.txt (transformers' CLIPConverter)."""
    tk = _library()
    try:
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        lines = (directory / "merges.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DiffusionPackageError(f"{directory}: vocab.json / merges.txt unreadable ({exc})") from exc
    merges = [tuple(line.split()) for line in lines if line and not line.startswith("#version")]
    if any(len(m) != 2 for m in merges) or not isinstance(vocab, dict):
        raise DiffusionPackageError(f"{directory}: merges.txt must hold two symbols a line")
    if EOS not in vocab or BOS not in vocab:
        raise DiffusionPackageError(f"{directory / 'vocab.json'}: lacks {BOS} or {EOS}")
    model = tk.models.BPE(
        vocab=vocab, merges=merges, unk_token=EOS, end_of_word_suffix="</w>", continuing_subword_prefix=""
    )
    tokenizer = tk.Tokenizer(model)
    tokenizer.normalizer = tk.normalizers.Sequence(
        [tk.normalizers.NFC(), tk.normalizers.Replace(tk.Regex(r"\s+"), " "), tk.normalizers.Lowercase()]
    )
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(CLIP_PATTERN), behavior="removed", invert=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = tk.decoders.ByteLevel()
    return tokenizer


class ClipTokenizer:
    def __init__(self, tokenizer: Any, max_length: int, pad_token: str = EOS) -> None:
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.bos = self._id(BOS)
        self.eos = self._id(EOS)
        self.pad = self._id(pad_token)

    def _id(self, token: str) -> int:
        found = self._tokenizer.token_to_id(token)
        if found is None:
            raise DiffusionPackageError(f"the tokenizer has no {token!r} token")
        return int(found)

    @classmethod
    def from_directory(cls, directory: str | Path, max_length: int | None = None) -> ClipTokenizer:
        """tokenizer.json, else vocab.json + merges.txt; tokenizer_config.json for the length and pad."""
        directory = Path(directory)
        config = _config(directory / "tokenizer_config.json")
        if (directory / "tokenizer.json").is_file():
            try:
                tokenizer = _library().Tokenizer.from_file(str(directory / "tokenizer.json"))
            except Exception as exc:  # the library raises plain Exception on a malformed file
                raise DiffusionPackageError(f"{directory / 'tokenizer.json'}: unreadable ({exc})") from exc
        elif (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
            tokenizer = _from_vocab(directory)
        else:
            raise DiffusionPackageError(
                f"{directory}: no tokenizer.json, nor vocab.json and merges.txt (CLIP's tokenizer files)"
            )
        length = max_length or config.get("model_max_length")
        if not isinstance(length, int) or not 2 < length < UNSET_LENGTH:
            length = DEFAULT_MAX_LENGTH
        pad = config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        return cls(tokenizer, length, pad if isinstance(pad, str) else EOS)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def largest_id(self) -> int:
        return max(self._tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)

    def encode(self, prompt: str) -> list[int]:
        """``max_length`` ids: start, the prompt's tokens (truncated), end, padding."""
        body = list(self._tokenizer.encode(prompt, add_special_tokens=False).ids)[: self.max_length - 2]
        ids = [self.bos, *body, self.eos]
        return ids + [self.pad] * (self.max_length - len(ids))

    def to_json(self) -> str:
        return self._tokenizer.to_str()

    def settings(self) -> dict[str, Any]:
        """What a package records beside tokenizer.json to rebuild this tokenizer exactly."""
        return {"max_length": self.max_length, "pad_token": self._tokenizer.id_to_token(self.pad)}


def _config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DiffusionPackageError(f"{path}: not readable JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def load_package_tokenizer(path: str | Path, max_length: int, pad_token: str) -> ClipTokenizer:
    """A package's tokenizer.json with the length and pad token its description records."""
    try:
        tokenizer = _library().Tokenizer.from_file(str(path))
    except DiffusionPackageError:
        raise
    except Exception as exc:  # the library raises plain Exception on a malformed file
        raise DiffusionPackageError(f"{path}: not a readable tokenizer ({exc})") from exc
    return ClipTokenizer(tokenizer, max_length, pad_token)
