"""The database: SQLite in the data directory by default, PostgreSQL through FERRY_DATABASE_URL."""

from __future__ import annotations

import os

import dj_database_url

from .base import DATA_DIR

# --- Database: SQLite in var/ by default, PostgreSQL through FERRY_DATABASE_URL --------------
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("FERRY_DATABASE_URL", f"sqlite:///{DATA_DIR / 'ferry.sqlite3'}"),
        conn_max_age=int(os.environ.get("FERRY_DB_CONN_MAX_AGE", "60")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, gateway) share the file: WAL and immediate
    # transactions keep writers from failing with "database is locked".
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
