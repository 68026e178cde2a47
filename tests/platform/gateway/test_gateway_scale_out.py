"""Scale-out: two real gateway processes on one port (SO_REUSEPORT) sharing PostgreSQL and Redis.

The kernel spreads the devices' connections over both processes; a release saved in this
process is published once through Redis and reaches the watching devices on either gateway."""

from __future__ import annotations

import os
import sys
import threading

import grpc
import pytest
import requests
from ferry_cloud.stack import free_port, wait_for_port
from releases.services import release_create

from tests.platform.ferry_cloud.test_observability import sample, samples
from tests.platform.ferry_cloud.test_observability_processes import Processes, _env, _until
from tests.platform.gateway.devices import Served, enrol

pytestmark = pytest.mark.slow
DEVICES = 16


@pytest.fixture
def processes(tmp_path):
    running = Processes(tmp_path / "logs")
    yield running
    running.stop()


def _open_streams(gateway: Served, org) -> tuple[list[threading.Event], list]:
    """One enrolled device per stream, each on a connection of its own; an Event per hint heard."""
    heard, streams = [], []
    for i in range(DEVICES):
        client, _ = enrol(gateway, org, name=f"d{i}")
        stream = client.watch("", timeout=120)
        got = threading.Event()

        def read(stream=stream, got=got) -> None:
            try:
                for _ in stream:
                    got.set()
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        heard.append(got)
        streams.append(stream)
    return heard, streams


def test_hints_reach_devices_on_both_gateways_sharing_one_port(
    org, admin, ready_version, transactional_db, tmp_path, processes
):
    port, enrol_port = free_port(), free_port()
    metrics_ports = [free_port(), free_port()]
    env = _env(
        tmp_path, REDIS_URL=os.environ["REDIS_URL"], FERRY_GATEWAY_ENROL_ADDRESS=f"127.0.0.1:{enrol_port}"
    )
    for i, metrics_port in enumerate(metrics_ports):
        args = [sys.executable, "manage.py", "gateway", "--address", f"127.0.0.1:{port}"]
        child = processes.spawn(f"gateway-{i}", [*args, "--metrics-port", str(metrics_port)], env)
        wait_for_port(metrics_port, 60, process=child)
    wait_for_port(port, 60)
    heard, streams = _open_streams(Served(f"127.0.0.1:{port}", f"127.0.0.1:{enrol_port}"), org)

    def held() -> list[float]:
        scrape = [requests.get(f"http://127.0.0.1:{p}/metrics", timeout=10).text for p in metrics_ports]
        return [sample(samples(text), "ferry_gateway_hint_streams_open") for text in scrape]

    _until("every stream open", lambda: sum(held()) == DEVICES, 60, processes)
    per_process = held()
    assert all(n > 0 for n in per_process), f"one process took every connection: {per_process}"

    release_create(organisation=org, version=ready_version, name="r", target={}, actor=admin[0], start=True)
    _until("a hint on every stream", lambda: all(got.is_set() for got in heard), 30, processes)
    for stream in streams:
        stream.cancel()
    _until("the streams closed", lambda: sum(held()) == 0, 30, processes)
