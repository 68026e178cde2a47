"""A reconnect storm on a busy gateway: calls that wait for the event loop are queued, not shed.

grpc core holds a call that arrived before the server's loop asked for it in a pending queue,
and by default cancels new ones once that queue passes 1,000 (at random) or 3,000 (all of them):
the CANCELLED streams of bench/fleet_storm.py's slow storms.  Here the gateway's loop is blocked
while a burst of calls arrives on one connection; every call must be answered once it is free.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
from ferry_cloud.device_ca import device_ca_certificate
from gateway.hints import HintHub
from gateway.server import build_server, server_options
from grpc_health.v1 import health_pb2, health_pb2_grpc

BURST = 1_600  # past grpc's default soft limit of 1,000 pending calls: some would be cancelled


def _block(started: threading.Event, seconds: float) -> None:
    started.set()
    time.sleep(seconds)  # the loop is busy (a storm's handshakes and handlers, a loaded host)


def test_a_burst_behind_a_busy_loop_is_answered_in_full(transactional_db):
    hub = HintHub(poll_seconds=0.2, max_watchers=BURST)
    server, _port = bound = build_server("127.0.0.1:0", workers=2, hub=hub)
    server.start()
    # the enrolment port (server TLS only) serves the health service too: no device, no database
    credentials = grpc.ssl_channel_credentials(root_certificates=device_ca_certificate())
    channel = grpc.secure_channel(f"127.0.0.1:{bound.enrol_port}", credentials)
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)  # warm: the loop is serving
        started = threading.Event()
        server.loop.call_soon_threadsafe(_block, started, 3.0)
        assert started.wait(5)
        calls = [stub.Check.future(health_pb2.HealthCheckRequest(), timeout=60) for _ in range(BURST)]
        codes: Counter = Counter()
        for call in calls:
            try:
                call.result()
                codes[grpc.StatusCode.OK] += 1
            except grpc.RpcError as exc:
                codes[exc.code()] += 1
        assert codes == Counter({grpc.StatusCode.OK: BURST})
    finally:
        channel.close()
        server.stop(grace=None)
        hub.stop()


def test_the_pending_limit_covers_every_stream_the_hub_may_hold():
    options = dict(server_options(20_000))
    assert options["grpc.server.max_pending_requests"] >= 20_000
    assert options["grpc.server.max_pending_requests_hard_limit"] >= 20_000
    assert options["grpc.server_max_unrequested_time_in_server"] >= 600
