"""The agent's side of deploy/proto/agent.proto: one channel, the credential on every call."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc

from agent.outbox import OutboxRecord
from deploy.proto import agent_pb2, agent_pb2_grpc

CALL_TIMEOUT_SECONDS = 10.0


class GatewayClient:
    def __init__(self, address: str, credential: str = "") -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address)
        self._stub = agent_pb2_grpc.AgentGatewayStub(self._channel)
        self.credential = credential

    def _metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.credential}")]

    def enrol(self, token: str, name: str, attributes: agent_pb2.DeviceAttributes) -> agent_pb2.EnrolResponse:
        request = agent_pb2.EnrolRequest(token=token, name=name, attributes=attributes)
        return self._stub.Enrol(request, timeout=CALL_TIMEOUT_SECONDS)

    def check_in(
        self,
        attributes: agent_pb2.DeviceAttributes,
        version_id: str,
        package_digest: str,
        update: agent_pb2.UpdateStatus | None = None,
    ) -> agent_pb2.CheckInResponse:
        request = agent_pb2.CheckInRequest(
            attributes=attributes,
            running_version_id=version_id,
            running_package_digest=package_digest,
            update=update,
        )
        return self._stub.CheckIn(request, timeout=CALL_TIMEOUT_SECONDS, metadata=self._metadata())

    def download(self, digest: str, offset: int, deadline_seconds: float) -> Iterator[agent_pb2.PackageChunk]:
        request = agent_pb2.DownloadRequest(package_digest=digest, offset=offset)
        return self._stub.DownloadPackage(request, timeout=deadline_seconds, metadata=self._metadata())

    def watch(self, version_id: str, timeout: float = 600.0) -> Iterator[agent_pb2.Hint]:
        """The server-pushed hints stream (push then pull: a hint only means "check in now")."""
        request = agent_pb2.WatchRequest(running_version_id=version_id)
        return self._stub.WatchHints(request, timeout=timeout, metadata=self._metadata())

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
        return self._stub.ReportTelemetry(batch, timeout=CALL_TIMEOUT_SECONDS, metadata=self._metadata())

    def close(self) -> None:
        self._channel.close()
