"""Sinks: where post-processed results go (telemetry is wired up by agent/inference.py)."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)


def file_sink(path: str) -> Callable[[dict], None]:
    out = open(path, "a")  # noqa: SIM115 - lives as long as the pipeline

    def write(result: dict) -> None:
        out.write(json.dumps(result, sort_keys=True) + "\n")
        out.flush()

    return write


def socket_sink(path: str) -> Callable[[dict], None]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def send(result: dict) -> None:
        try:
            sock.sendto(json.dumps(result).encode(), path)
        except OSError as exc:  # nobody listening: results are not worth blocking the stream for
            log.debug("socket sink %s: %s", path, exc)

    return send
