"""WatchHints (push then pull), over real gRPC, with Redis pub/sub and with the database poll."""

from __future__ import annotations

import threading

import grpc
import pytest
from gateway.hints import HintHub
from gateway.server import build_server
from releases.services import release_create, release_transition

from deploy.proto import agent_pb2
from tests.platform.gateway.devices import Served, enrol


def _serve(hub: HintHub):
    server, port = bound = build_server("127.0.0.1:0", workers=2, hub=hub)
    server.start()
    return server, Served(f"127.0.0.1:{port}", f"127.0.0.1:{bound.enrol_port}")


def _watch(gateway: Served, org) -> tuple[list[str], threading.Event, grpc.Future]:
    client, _ = enrol(gateway, org, name="d")
    stream = client._stub.WatchHints(agent_pb2.WatchRequest(), timeout=30)
    hints: list[str] = []
    got = threading.Event()

    def read() -> None:
        try:
            for hint in stream:
                hints.append(hint.reason)
                got.set()
        except grpc.RpcError:
            pass

    threading.Thread(target=read, daemon=True).start()
    return hints, got, stream


@pytest.mark.parametrize("mode", ["redis", "database"])
def test_a_release_change_reaches_a_watching_agent(mode, org, admin, ready_version, transactional_db):
    import os

    hub = HintHub(redis_url=os.environ["REDIS_URL"] if mode == "redis" else "", poll_seconds=0.2)
    server, gateway = _serve(hub)
    try:
        hints, got, stream = _watch(gateway, org)
        for _ in range(100):
            if hub.watchers == 1:
                break
            threading.Event().wait(0.05)
        assert hub.watchers == 1
        release = release_create(
            organisation=org, version=ready_version, name="r", target={}, actor=admin[0], start=False
        )
        assert got.wait(10), "no hint after a release was created"
        got.clear()
        release_transition(release_id=release.pk, action="start", actor=admin[0])
        assert got.wait(10), "no hint after a release was started"
        assert set(hints) == {"release changed"}
        stream.cancel()
        for _ in range(100):
            if hub.watchers == 0:
                break
            threading.Event().wait(0.05)
        assert hub.watchers == 0, "a cancelled stream must leave the hub"
    finally:
        server.stop(grace=None)
        hub.stop()


def test_watch_without_a_client_certificate_is_refused(transactional_db):
    hub = HintHub(poll_seconds=0.2)
    server, gateway = _serve(hub)
    try:
        stream = gateway.enrol_client()._stub.WatchHints(agent_pb2.WatchRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(stream))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(grace=None)


def test_full_hub_tells_the_agent_to_poll(org, transactional_db):
    hub = HintHub(poll_seconds=0.2, max_watchers=0)
    server, gateway = _serve(hub)
    try:
        client, _ = enrol(gateway, org, name="d")
        stream = client._stub.WatchHints(agent_pb2.WatchRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(stream))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "keep polling" in refused.value.details()
    finally:
        server.stop(grace=None)
