"""grpc.health.v1 for the gateway: SERVING while it can reach its migrated database.

A thread re-checks every few seconds (faster while failing), on a fresh short-timeout
connection (the same check as the web's /readyz), so an orchestrator's probe sees a database
outage and the recovery.  Until the first successful check everything is NOT_SERVING.

The servicer is grpc_health's asyncio one (its Watch holds no thread); its status lives on the
gateway's event loop, so the checking thread hands each change to that loop.
"""

from __future__ import annotations

import asyncio
import threading

import structlog
from ferry_cloud.observability.health import check_database
from grpc_health.v1 import health, health_pb2

from deploy.proto import agent_pb2

log = structlog.get_logger("ferry.gateway.health")
GATEWAY_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentGateway"].full_name
SERVICES = ("", GATEWAY_SERVICE)  # "" is the server as a whole
HAND_OVER_SECONDS = 5.0


class GatewayHealth:
    def __init__(self, *, interval: float = 5.0, timeout: float = 2.0) -> None:
        self.interval = interval
        self.timeout = timeout
        self.servicer = health.aio.HealthServicer()
        self.serving: bool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def attach(self) -> None:
        """On the server's loop, before it serves: the status so far (NOT_SERVING at first)."""
        self._loop = asyncio.get_running_loop()
        await self._apply(bool(self.serving))

    async def _apply(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in SERVICES:
            await self.servicer.set(service, status)

    def _set(self, serving: bool) -> None:
        """From the checking thread: the change, applied on the server's loop."""
        if self._loop is None or self._loop.is_closed():
            return  # attach() applies self.serving when the server starts
        done = asyncio.run_coroutine_threadsafe(self._apply(serving), self._loop)
        done.result(HAND_OVER_SECONDS)

    def check_once(self) -> bool:
        try:
            check_database(self.timeout)
            serving = True
        except Exception as exc:  # any failure: not serving, and say why once per change
            serving = False
            if self.serving is not False:
                log.warning("gateway not serving: database check failed", error=str(exc)[:300])
        if serving and self.serving is not True:
            log.info("gateway serving: database reachable")
        if serving != self.serving:
            self.serving = serving
            self._set(serving)
        return serving

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gateway-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            wait = self.interval if self.check_once() else min(1.0, self.interval)
            if self._stop.wait(wait):
                return

    def stop(self) -> None:
        """Shutting down: NOT_SERVING from now on, so balancers stop sending calls."""
        self._stop.set()
        if self._loop is not None and not self._loop.is_closed():
            shutdown = self.servicer.enter_graceful_shutdown()
            asyncio.run_coroutine_threadsafe(shutdown, self._loop).result(HAND_OVER_SECONDS)
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)


def probe(address: str, service: str = "", timeout: float = 3.0) -> bool:
    """One grpc.health.v1 Check: True when SERVING (for container health checks).

    The gateway serves mutual TLS only, so the probe runs where the gateway's files are: it
    mints itself a short-lived client certificate with the device CA (naming no device, so it
    can call nothing but Health) and checks the server's name from the gateway's certificate."""
    import grpc
    from grpc_health.v1 import health_pb2_grpc

    credentials, server_name = _probe_credentials()
    options = [("grpc.ssl_target_name_override", server_name)]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _probe_credentials():
    from datetime import timedelta

    import grpc
    from cryptography import x509
    from ferry_cloud.device_ca import device_ca, gateway_server_certificate

    from deploy.trust import certificates

    ca = device_ca()
    key = certificates.create_private_key()
    issued = certificates.sign_client_certificate(
        ca, certificates.create_csr(key), device_id=PROBE_ID, lifetime=timedelta(minutes=5)
    )
    server = certificates.load_certificate(gateway_server_certificate().certificate_pem)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = names.get_values_for_type(x509.DNSName)
    server_name = dns[0] if dns else str(names.get_values_for_type(x509.IPAddress)[0])
    credentials = grpc.ssl_channel_credentials(ca.certificate_pem, key, issued.certificate_pem)
    return credentials, server_name


PROBE_ID = "00000000-0000-0000-0000-000000000000"  # no device has it: the probe can only ask Health


if __name__ == "__main__":
    # python -m gateway.health [host:port]: exit 0 when the gateway is SERVING, 1 otherwise
    import os
    import sys

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")  # the probe reads the PKI files

    sys.exit(0 if probe(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051") else 1)
