"""Exceptions the LLM runtime raises; each message names the field, tensor or limit at fault."""

from __future__ import annotations

from engine.errors import EngineError


class LlmError(EngineError):
    """Base class of every error the LLM runtime raises on purpose."""


class UnsupportedModelError(LlmError):
    """config.json describes a model this runtime cannot run (names the field and its value)."""


class CheckpointError(LlmError):
    """A checkpoint or package file is missing, truncated or inconsistent with config.json
    (names the file or tensor)."""


class ContextLimitError(LlmError):
    """The prompt plus the tokens to generate do not fit the KV cache's context length."""


class TokenizerError(LlmError):
    """The tokenizer is missing, unreadable, or its vocabulary does not fit the embedding."""
