"""Exceptions the diffusion runtime raises; each message names the field, file or limit at fault."""

from __future__ import annotations

from engine.errors import EngineError


class DiffusionError(EngineError):
    """Base class of every error the diffusion runtime raises on purpose."""


class SchedulerConfigError(DiffusionError):
    """scheduler_config.json asks for something these schedulers do not implement (names the field)."""


class DiffusionPackageError(DiffusionError):
    """A diffusion package's files are missing or disagree with each other (names the file)."""


class GenerationRequestError(DiffusionError):
    """A generation request is outside what the package allows (size, steps, guidance...)."""
