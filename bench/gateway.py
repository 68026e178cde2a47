"""A minimal local control plane for agent benchmarks: a real gRPC server on 127.0.0.1.

It speaks deploy/proto/agent.proto as far as an idle or updating agent needs: enrolment,
check-ins carrying one offer, package downloads, telemetry (accepted and dropped) and an open
hints stream, as the real gateway keeps.  Like the real gateway it serves TLS only: Enrol on
a server-TLS port, everything else with the client certificate it issued from the agent's CSR.
No failure injection: that is the tests' double (tests/agent/double.py), and benchmarks must
not depend on the test suite.
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
from deploy.trust import certificates
from deploy.trust.assignment import Assignment, sign_assignment
from deploy.trust.bundle import EnrolmentBundle, encode_bundle

DEVICE_ID = "00000000-0000-4000-8000-00000000be0c"
ENROLMENT_TOKEN = "good-token"
ORGANISATION_ID = "bench"  # packages for the bench agent are signed for it
CHUNK_BYTES = 64 * 1024
CA = certificates.create_ca("bench CA")
SERVER = certificates.create_server_certificate(CA, ip_addresses=["127.0.0.1"])


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
        # a plaintext port (bench/gateway_tls.py's baseline) has no peer: it is trusted as is
        uris = [v.decode() for v in context.auth_context().get("x509_subject_alternative_name", ())]
        tls = context.auth_context().get("transport_security_type") == [b"ssl"]
        if tls and uris != [certificates.device_uri(DEVICE_ID)]:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no client certificate of this gateway")

    def Enrol(self, request, context):
        if request.token != ENROLMENT_TOKEN:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "unknown enrolment token")
        issued = certificates.sign_client_certificate(CA, request.csr, device_id=DEVICE_ID)
        grant = agent_pb2.EnrolGrant(
            device_id=DEVICE_ID,
            organisation_id=ORGANISATION_ID,
            client_certificate=certificates.certificate_der(issued.certificate_pem),
            release_public_keys=[self.public_key],
            checkin_interval_seconds=self.interval,
        ).SerializeToString()
        return agent_pb2.EnrolResponse(grant=grant, signature=certificates.sign(CA.key_pem, grant))

    def Renew(self, request, context):
        self._auth(context)
        issued = certificates.sign_client_certificate(CA, request.csr, device_id=DEVICE_ID)
        return agent_pb2.RenewResponse(
            client_certificate=certificates.certificate_der(issued.certificate_pem)
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


ENROL_PORTS: dict[int, int] = {}  # mutual-TLS port -> enrolment port


def serve(gateway: BenchGateway, workers: int = 4, plaintext_port: bool = False) -> tuple[grpc.Server, int]:
    """Start the server on a free mutual-TLS port and a free enrolment port (bundle() names
    both); it listens when this returns.  plaintext_port adds a third, insecure port, only for
    measuring what TLS costs: its number is ENROL_PORTS[-port]."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(gateway, server)
    pairs = [(SERVER.key_pem, SERVER.certificate_pem)]
    mutual = grpc.ssl_server_credentials(
        pairs, root_certificates=CA.certificate_pem, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", mutual)
    ENROL_PORTS[port] = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(pairs))
    if plaintext_port:
        ENROL_PORTS[-port] = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def bundle(port: int) -> str:
    """The enrolment bundle for the bench gateway serving on port."""
    return encode_bundle(
        EnrolmentBundle(
            gateway=f"127.0.0.1:{port}",
            enrol=f"127.0.0.1:{ENROL_PORTS[port]}",
            token=ENROLMENT_TOKEN,
            ca_pem=CA.certificate_pem,
        )
    )
