"""structlog for the control plane: JSON lines (or a console format) for structlog and stdlib loggers.

Every process (web, gateway, Celery worker and beat, management commands) gets the same
configuration from the settings, so Django's, Celery's and gRPC's own records come out in
the same format as Ferry's, carry the bound request id and pass through the secret redaction.
"""

from __future__ import annotations

from typing import Any

import structlog

from ferry_cloud.observability.redact import redact_secrets

FORMATS = ("json", "console")


def _shared_processors() -> list:
    """What both structlog and stdlib records go through before rendering."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.stdlib.ExtraAdder(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def _renderer(fmt: str):
    if fmt == "console":
        # plain tracebacks: rich ones print local variables, which may hold secrets
        return structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    return structlog.processors.JSONRenderer()  # its default= turns any other object into repr


def _final_processors(fmt: str) -> list:
    # exceptions become text first (format_exc_info), so redaction also covers tracebacks
    return [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        structlog.processors.format_exc_info,
        redact_secrets,
        _renderer(fmt),
    ]


def configure_structlog() -> None:
    """structlog hands its events to stdlib logging; the handler's formatter renders them."""
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.processors.UnicodeDecoder(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def formatter(fmt: str) -> structlog.stdlib.ProcessorFormatter:
    """The formatter LOGGING installs, for a handler of one's own (tests, tools)."""
    return structlog.stdlib.ProcessorFormatter(
        processors=_final_processors(fmt), foreign_pre_chain=_shared_processors()
    )


def logging_config(fmt: str, level: str) -> dict[str, Any]:
    """Django's LOGGING: one handler on standard error whose formatter is structlog's."""
    if fmt not in FORMATS:
        raise ValueError(f"FERRY_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processors": _final_processors(fmt),
                "foreign_pre_chain": _shared_processors(),
            }
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # runserver's own access line and Celery's "Task ... succeeded" repeat what the
            # request and task lines say (ferry.request, ferry.task); failures still show
            "django.server": {"level": "WARNING"},
            "celery.app.trace": {"level": "WARNING"},
        },
    }


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
