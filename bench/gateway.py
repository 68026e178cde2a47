"""A minimal local control plane for agent benchmarks: a real gRPC server on 127.0.0.1.

It speaks deploy/proto/agent.proto as far as an idle or updating agent needs: enrolment,
check-ins carrying one offer, package downloads, telemetry (accepted and dropped) and an open
hints stream, as the real gateway keeps.  No failure injection: that is the tests' double
(tests/agent/double.py), and benchmarks must not depend on the test suite.
"""

from __future__ import annotations

import queue
import tarfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from deploy.package import KeyPair, file_sha256
from deploy.package.digest import bytes_sha256
from deploy.proto import agent_pb2, agent_pb2_grpc
from deploy.trust.assignment import Assignment, sign_assignment

CREDENTIAL = "bench-device.secret"
ENROLMENT_TOKEN = "good-token"
DEVICE_ID = "bench-device"
ORGANISATION_ID = "bench"  # packages for the bench agent are signed for it
CHUNK_BYTES = 64 * 1024


class BenchGateway(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(self, keys: KeyPair, interval: int = 30) -> None:
        self.keys = keys
        self.public_key = keys.public_key
        self.interval = interval
        self.offer: agent_pb2.PackageOffer | None = None
        self.packages: dict[str, bytes] = {}
        self._watchers: list[queue.Queue] = []
        self._lock = threading.Lock()

    def publish(self, archive: Path, version_id: str) -> None:
        """Offer a signed package to every agent, and hint them to check in now."""
        data = archive.read_bytes()
        digest = file_sha256(archive)
        self.packages[digest] = data
        with tarfile.open(archive) as tar:
            manifest = tar.extractfile(tar.next()).read()
        now = int(time.time())
        assignment = Assignment(
            device_id=DEVICE_ID,
            organisation_id=ORGANISATION_ID,
            counter=int(time.time() * 1000),
            issued_at=now,
            expires_at=now + 3600,
            version_id=version_id,
            release_id="bench",
            package_digest=digest,
            package_size=len(data),
            manifest_sha256=bytes_sha256(manifest),
        )
        blob, signature = sign_assignment(assignment, self.keys.private_key)
        self.offer = agent_pb2.PackageOffer(
            release_id="bench",
            version_id=version_id,
            version_label=version_id,
            model_name="classifier",
            package_digest=digest,
            package_size=len(data),
            assignment=blob,
            assignment_signature=signature,
        )
        with self._lock:
            for q in self._watchers:
                q.put("release changed")

    def _auth(self, context) -> None:
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {CREDENTIAL}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown credential")

    def Enrol(self, request, context):
        if request.token != ENROLMENT_TOKEN:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "unknown enrolment token")
        return agent_pb2.EnrolResponse(
            device_id=DEVICE_ID,
            credential=CREDENTIAL,
            release_public_key=self.public_key,
            checkin_interval_seconds=self.interval,
            organisation_id=ORGANISATION_ID,
        )

    def CheckIn(self, request, context):
        self._auth(context)
        response = agent_pb2.CheckInResponse(checkin_interval_seconds=self.interval)
        if self.offer is not None:
            response.desired.CopyFrom(self.offer)
        return response

    def DownloadPackage(self, request, context):
        self._auth(context)
        data = self.packages.get(request.package_digest)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such package")
        for offset in range(request.offset, len(data), CHUNK_BYTES):
            yield agent_pb2.PackageChunk(
                offset=offset, data=data[offset : offset + CHUNK_BYTES], total_size=len(data)
            )

    def ReportTelemetry(self, request, context):
        self._auth(context)
        return agent_pb2.TelemetryAck(stored_seqs=[r.seq for r in request.records])

    def WatchHints(self, request, context):
        self._auth(context)
        q: queue.Queue = queue.Queue()
        with self._lock:
            self._watchers.append(q)
        try:
            while context.is_active():
                try:
                    yield agent_pb2.Hint(reason=q.get(timeout=0.5))
                except queue.Empty:
                    continue
        finally:
            with self._lock:
                self._watchers.remove(q)


def serve(gateway: BenchGateway) -> tuple[grpc.Server, int]:
    """Start the server on a free port; it listens when this returns."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port
