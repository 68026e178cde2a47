"""Logging: one handler on standard error; FERRY_LOG_LEVEL sets the level."""

from __future__ import annotations

import os

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("FERRY_LOG_LEVEL", "INFO")},
    "loggers": {"django.server": {"level": "WARNING"}},
}
