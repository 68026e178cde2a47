"""The agent's side of deploy/proto/agent.proto: one TLS channel that trusts only the pinned CA,
with the device's client certificate once it has one."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import grpc

from agent.outbox import OutboxRecord
from deploy.proto import agent_pb2, agent_pb2_grpc

CALL_TIMEOUT_SECONDS = 10.0


class GatewayClient:
    """ca_pem is the only root trusted for the gateway's certificate; key_pem and
    certificate_pem (PEM) are the device's client identity (absent only to enrol)."""

    def __init__(
        self, address: str, *, ca_pem: bytes, key_pem: bytes = b"", certificate_pem: bytes = b""
    ) -> None:
        self.address = address
        self.ca_pem = ca_pem
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self.use_certificate(key_pem, certificate_pem)

    def use_certificate(self, key_pem: bytes, certificate_pem: bytes) -> None:
        """Switch to a (renewed) client certificate: calls from now on use a new channel."""
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem,
            private_key=key_pem or None,
            certificate_chain=certificate_pem or None,
        )
        channel = grpc.secure_channel(self.address, credentials)
        with self._lock:
            old, self._channel = self._channel, channel
            self._stub = agent_pb2_grpc.AgentGatewayStub(channel)
        if old is not None:
            old.close()  # an open hint stream on it ends; the agent reopens it on the new channel

    def enrol(
        self, token: str, name: str, attributes: agent_pb2.DeviceAttributes, csr: bytes
    ) -> agent_pb2.EnrolResponse:
        request = agent_pb2.EnrolRequest(token=token, name=name, attributes=attributes, csr=csr)
        return self._stub.Enrol(request, timeout=CALL_TIMEOUT_SECONDS)

    def renew(self, csr: bytes) -> agent_pb2.RenewResponse:
        return self._stub.Renew(agent_pb2.RenewRequest(csr=csr), timeout=CALL_TIMEOUT_SECONDS)

    def check_in(
        self,
        attributes: agent_pb2.DeviceAttributes,
        version_id: str,
        package_digest: str,
        update: agent_pb2.UpdateStatus | None = None,
        held_assignment_counter: int = 0,
        hinted: bool = False,
        key_rotation_sequence: int = 0,
    ) -> agent_pb2.CheckInResponse:
        request = agent_pb2.CheckInRequest(
            attributes=attributes,
            running_version_id=version_id,
            running_package_digest=package_digest,
            update=update,
            held_assignment_counter=held_assignment_counter,
            hinted=hinted,
            key_rotation_sequence=key_rotation_sequence,
        )
        return self._stub.CheckIn(request, timeout=CALL_TIMEOUT_SECONDS)

    def download(self, digest: str, offset: int, deadline_seconds: float) -> Iterator[agent_pb2.PackageChunk]:
        request = agent_pb2.DownloadRequest(package_digest=digest, offset=offset)
        return self._stub.DownloadPackage(request, timeout=deadline_seconds)

    def watch(self, version_id: str, timeout: float = 600.0) -> Iterator[agent_pb2.Hint]:
        """The server-pushed hints stream (push then pull: a hint only means "check in now")."""
        request = agent_pb2.WatchRequest(running_version_id=version_id)
        return self._stub.WatchHints(request, timeout=timeout)

    def report(self, records: list[OutboxRecord]) -> agent_pb2.TelemetryAck:
        batch = agent_pb2.TelemetryBatch(
            records=[
                agent_pb2.TelemetryRecord(
                    seq=r.seq,
                    kind=r.kind,
                    timestamp=r.timestamp,
                    version_id=r.version_id,
                    payload_json=json.dumps(r.payload),
                )
                for r in records
            ]
        )
        return self._stub.ReportTelemetry(batch, timeout=CALL_TIMEOUT_SECONDS)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
