"""The package's chat template (tokenizer_config.json's Jinja text) rendered in jinja2's immutable
sandbox, never eval'd; ChatML when the package has no template or jinja2 is not installed."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class TemplateError(Exception):
    """The package's chat template does not render (the package's fault, not the request's)."""


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template refused the messages: {message}")


def chatml(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ChatTemplate:
    def __init__(self, source: str | None, special: dict[str, Any] | None = None) -> None:
        self.source = source
        self.special = {k: _token_text(v) for k, v in (special or {}).items()}
        self._compiled = None
        if source:
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
            except ImportError:  # jinja2 is in the device lock; a bare install falls back, loudly
                log.warning("jinja2 is not installed: the package's chat template is replaced by ChatML")
                return
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            try:
                self._compiled = env.from_string(source)
            except Exception as exc:  # jinja2's TemplateSyntaxError and friends
                raise TemplateError(f"the package's chat template does not parse: {exc}") from exc

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if self._compiled is None:
            return chatml(messages, add_generation_prompt)
        try:
            return self._compiled.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special
            )
        except TemplateError:
            raise
        except Exception as exc:  # a sandbox violation or a runtime error in the template
            raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


def _token_text(value: Any) -> Any:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content", "")
    return value
