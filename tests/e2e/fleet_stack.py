"""What the end-to-end release tests share: a control plane's environment on its own database,
the fleet of three labelled agents (one jetson, two generic) they release to, and reading
which version each agent runs. Used by tests/e2e/test_release_refusals.py and
tests/console/test_console_release_manager.py (a conftest would reach only one of them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from ferry_cloud.stack import RestClient, Stack

from tests.e2e.helpers import own_database

HARDWARE = ("jetson", "generic", "generic")  # agent-0 takes a jetson-only version, the others refuse it


@contextmanager
def release_environment(
    tmp_path: Path, database: str, *, checkin_seconds: int, gate_seconds: float | None = 1
) -> Iterator[dict[str, str]]:
    """The control plane's environment: its own database (dropped after), data under tmp_path,
    quick check-ins, the health gate evaluated every ``gate_seconds`` by beat (None: the
    default interval)."""
    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    with own_database(database) as database_url:
        environment = {
            "FERRY_DATA_DIR": str(tmp_path / "data"),
            "FERRY_DATABASE_URL": database_url,
            "FERRY_S3_BUCKET": "",
            "FERRY_CHECKIN_INTERVAL_SECONDS": str(checkin_seconds),
            "FERRY_RELEASE_KEY_FILE": str(tmp_path / "data" / "release.key"),
        }
        if gate_seconds is not None:
            environment["FERRY_GATE_INTERVAL_SECONDS"] = str(gate_seconds)
        yield environment


def start_agents(
    stack: Stack, api: RestClient, gateway_port: int, tmp_path: Path, labels: dict[str, str]
) -> None:
    """agent-0, agent-1 and agent-2 (HARDWARE), each enrolled with its own token carrying ``labels``,
    reporting metrics and telemetry every second."""
    for i, hardware in enumerate(HARDWARE):
        enrolment = api.call("POST", "enrolment-tokens/", json={"labels": labels})["token"]
        extra = ["--hardware", hardware, "--metrics-interval", "1", "--upload-interval", "1"]
        stack.start_agent(f"agent-{i}", gateway_port, tmp_path / f"agent-{i}", enrolment, {}, extra=extra)


def running(api: RestClient) -> dict[str, str | None]:
    """Each device's name and the label of the version it runs (None: nothing yet)."""
    return {
        d["name"]: (d["running_version_info"] or {}).get("label")
        for d in api.call("GET", "devices/")["results"]
    }
