"""A small control plane for agent tests: a real gRPC server speaking deploy/proto/agent.proto.

It serves packages from files, offers whatever the test says, pushes hints, stores telemetry
by sequence number (counting duplicates) and can throttle or corrupt downloads, so the agent
process under test meets every failure over a real socket.  Like the real gateway it serves
TLS only: enrolment on a server-TLS port, everything else with the client certificate it
issued (one CA per test process).  The real gateway is tested in tests/platform and end to
end in tests/e2e.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from agent.client import GatewayClient
from deploy.package import KeyPair, file_sha256
from deploy.package.digest import bytes_sha256
from deploy.proto import agent_pb2, agent_pb2_grpc
from deploy.trust import certificates
from deploy.trust.assignment import Assignment, sign_assignment
from deploy.trust.bundle import EnrolmentBundle, encode_bundle

ROOT = Path(__file__).resolve().parents[2]
DEVICE_ID = "00000000-0000-4000-8000-000000000001"
ORGANISATION_ID = "1"  # the double's grant names it; packages for its device are signed for it
_PKI: dict[str, certificates.KeyPair] = {}
_ENROL_PORT_OF: dict[int, int] = {}  # the double's mutual-TLS port -> its enrolment port


def pki() -> tuple[certificates.KeyPair, certificates.KeyPair]:
    """The double's CA and its server certificate for 127.0.0.1 (made once per test process)."""
    if not _PKI:
        _PKI["ca"] = certificates.create_ca("double CA")
        _PKI["server"] = certificates.create_server_certificate(_PKI["ca"], ip_addresses=["127.0.0.1"])
    return _PKI["ca"], _PKI["server"]


def bundle(port: int, token: str = "good-token") -> str:
    """The enrolment bundle for the double serving on port."""
    ca, _ = pki()
    return encode_bundle(
        EnrolmentBundle(
            gateway=f"127.0.0.1:{port}",
            enrol=f"127.0.0.1:{_ENROL_PORT_OF[port]}",
            token=token,
            ca_pem=ca.certificate_pem,
        )
    )


def device_client(port: int) -> GatewayClient:
    """A client holding a certificate the double issued to DEVICE_ID."""
    ca, _ = pki()
    key = certificates.create_private_key()
    issued = certificates.sign_client_certificate(ca, certificates.create_csr(key), device_id=DEVICE_ID)
    return GatewayClient(
        f"127.0.0.1:{port}", ca_pem=ca.certificate_pem, key_pem=key, certificate_pem=issued.certificate_pem
    )


def manifest_sha256(archive: Path) -> str:
    """The digest of the archive's first member (the manifest), as the control plane records it."""
    with tarfile.open(archive) as tar:
        first = tar.next()
        return bytes_sha256(tar.extractfile(first).read())


class GatewayDouble(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(self, keys: KeyPair, interval: int = 1) -> None:
        self.keys = keys
        self.public_key = keys.public_key
        self.counter = int(time.time() * 1000)  # as the control plane: a new double never goes back
        self.interval = interval
        self.offer: agent_pb2.PackageOffer | None = None
        self.packages: dict[str, bytes] = {}
        self.chunk_bytes = 64 * 1024
        self.chunk_delay = 0.0
        self.records: dict[int, dict] = {}
        self.duplicates = 0
        self.download_offsets: list[int] = []
        self.check_ins = 0
        self.certificate_lifetime = certificates.DEFAULT_CLIENT_LIFETIME
        self.renewals = 0
        self._watchers: list[queue.Queue] = []
        self._lock = threading.Lock()

    # --- what the test controls ------------------------------------------------------------
    def publish(
        self,
        archive: Path,
        version_id: str,
        *,
        offered_size: int | None = None,
        hint: bool = True,
        signed_by: bytes | None = None,
        changes: dict | None = None,
        **flags,
    ) -> agent_pb2.PackageOffer:
        """Offer the archive in a newly signed assignment (``changes`` alter its fields: a test
        plays a director that lies); returns the offer, which a test may replay later."""
        data = archive.read_bytes()
        digest = file_sha256(archive)
        self.packages[digest] = data
        self.counter += 1
        now = int(time.time())
        assignment = dict(
            device_id=DEVICE_ID,
            organisation_id=ORGANISATION_ID,
            counter=self.counter,
            issued_at=now,
            expires_at=now + 3600,
            version_id=version_id,
            release_id="r",
            package_digest=digest,
            package_size=len(data) if offered_size is None else offered_size,
            manifest_sha256=manifest_sha256(archive),
            rollback=bool(flags.get("rollback", False)),
            download_only=bool(flags.get("download_only", False)),
            window=dict(flags["window"]) if flags.get("window") else None,
        )
        assignment.update(changes or {})
        blob, signature = sign_assignment(Assignment(**assignment), signed_by or self.keys.private_key)
        self.offer = agent_pb2.PackageOffer(
            release_id="r",
            version_id=version_id,
            version_label=version_id,
            model_name="classifier",
            package_digest=digest,
            package_size=assignment["package_size"],
            assignment=blob,
            assignment_signature=signature,
            **flags,
        )
        if hint:
            self.hint("release changed")
        return self.offer

    def hint(self, reason: str) -> None:
        with self._lock:
            for q in self._watchers:
                q.put(reason)

    def activations(self) -> list[dict]:
        with self._lock:
            return [r["payload"] for _, r in sorted(self.records.items()) if r["kind"] == "activation"]

    def metrics(self) -> list[dict]:
        with self._lock:
            return [r["payload"] for _, r in sorted(self.records.items()) if r["kind"] == "metrics"]

    # --- the service ------------------------------------------------------------------------
    def _auth(self, context) -> None:
        uris = [v.decode() for v in context.auth_context().get("x509_subject_alternative_name", ())]
        if uris != [certificates.device_uri(DEVICE_ID)]:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no client certificate of this double")

    def Enrol(self, request, context):
        if request.token != "good-token":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "unknown enrolment token")
        ca, _ = pki()
        issued = certificates.sign_client_certificate(
            ca, request.csr, device_id=DEVICE_ID, lifetime=self.certificate_lifetime
        )
        grant = agent_pb2.EnrolGrant(
            device_id=DEVICE_ID,
            organisation_id=ORGANISATION_ID,
            client_certificate=certificates.certificate_der(issued.certificate_pem),
            release_public_keys=[self.public_key],
            checkin_interval_seconds=self.interval,
        ).SerializeToString()
        return agent_pb2.EnrolResponse(grant=grant, signature=certificates.sign(ca.key_pem, grant))

    def Renew(self, request, context):
        self._auth(context)
        ca, _ = pki()
        issued = certificates.sign_client_certificate(
            ca, request.csr, device_id=DEVICE_ID, lifetime=self.certificate_lifetime
        )
        self.renewals += 1
        return agent_pb2.RenewResponse(
            client_certificate=certificates.certificate_der(issued.certificate_pem)
        )

    def CheckIn(self, request, context):
        self._auth(context)
        self.check_ins += 1
        response = agent_pb2.CheckInResponse(checkin_interval_seconds=self.interval)
        if self.offer is not None:
            response.desired.CopyFrom(self.offer)
        return response

    def DownloadPackage(self, request, context):
        self._auth(context)
        data = self.packages.get(request.package_digest)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such package")
        self.download_offsets.append(request.offset)
        offset = request.offset
        while offset < len(data):
            chunk = data[offset : offset + self.chunk_bytes]
            yield agent_pb2.PackageChunk(offset=offset, data=chunk, total_size=len(data))
            offset += len(chunk)
            if self.chunk_delay:
                time.sleep(self.chunk_delay)

    def ReportTelemetry(self, request, context):
        self._auth(context)
        stored, duplicates = [], []
        with self._lock:
            for r in request.records:
                if r.seq in self.records:
                    duplicates.append(r.seq)
                    self.duplicates += 1
                else:
                    self.records[r.seq] = {"kind": r.kind, "payload": json.loads(r.payload_json)}
                    stored.append(r.seq)
        return agent_pb2.TelemetryAck(stored_seqs=stored, duplicate_seqs=duplicates)

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


def serve(double: GatewayDouble, port: int = 0) -> tuple[grpc.Server, int]:
    """The double on port (mutual TLS) and on a free enrolment port (server TLS)."""
    ca, server_pair = pki()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(double, server)
    pairs = [(server_pair.key_pem, server_pair.certificate_pem)]
    mutual = grpc.ssl_server_credentials(
        pairs, root_certificates=ca.certificate_pem, require_client_auth=True
    )
    port = server.add_secure_port(f"127.0.0.1:{port}", mutual)
    _ENROL_PORT_OF[port] = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(pairs))
    server.start()
    return server, port


AGENT_ARGS = [
    "--probation-seconds",
    "1.5",
    "--metrics-interval",
    "1",
    "--upload-interval",
    "0.3",
    "--event-rate",
    "5",
    "--hardware",
    "pi4",
    "--reserve-bytes",
    "0",
]


class AgentProcess:
    """`ferry-agent run` as a child process, its log in the state directory's parent."""

    def __init__(
        self,
        state_dir: Path,
        port: int,
        *,
        env: dict[str, str] | None = None,
        extra=(),
        preexec=None,
        token: str = "good-token",
        bundle_text: str | None = None,
    ):
        """bundle_text: the enrolment bundle of a real gateway; by default, the double's for token."""
        self.state_dir = state_dir
        self.log = state_dir.parent / f"{state_dir.name}.log"
        args = [sys.executable, "-m", "agent.cli", "run", "--gateway", f"127.0.0.1:{port}"]
        args += [
            "--state-dir",
            str(state_dir),
            "--bundle",
            bundle_text if bundle_text is not None else bundle(port, token) if token else "",
            *AGENT_ARGS,
            *extra,
        ]
        self._log_file = open(self.log, "ab")  # noqa: SIM115 - closed in stop()/kill()
        self.process = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec,
        )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 30.0) -> None:
        wait_for(lambda: needle in self.log_text(), timeout, f"{needle!r} in the agent log", self)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, like a power cut for the process."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log_file.close()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log_file.close()
        return code


def wait_for(predicate: Callable[[], object], timeout: float, what: str, agent: AgentProcess | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if agent is not None and agent.process.poll() is not None:
            raise AssertionError(
                f"agent exited ({agent.process.returncode}) waiting for {what}:\n{agent.log_text()[-3000:]}"
            )
        time.sleep(0.05)
    tail = agent.log_text()[-3000:] if agent is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")


def read_state(state_dir: Path) -> dict:
    """What the agent's own files say: the update state, the committed version, the pointer."""

    def load(name: str) -> dict:
        try:
            return json.loads((state_dir / name).read_text())
        except FileNotFoundError:
            return {}

    current = state_dir / "current"
    return {
        "update": load("update.json").get("state", "idle"),
        "running": load("running.json").get("version_id", ""),
        "current": os.readlink(current).rsplit("/", 1)[-1] if current.is_symlink() else "",
        "staging": sorted(p.name for p in (state_dir / "versions").glob(".*"))
        if (state_dir / "versions").exists()
        else [],
        "parts": sorted(p.name for p in (state_dir / "downloads").glob("*"))
        if (state_dir / "downloads").exists()
        else [],
    }


def whole_version(state_dir: Path, version_id: str) -> bool:
    """versions/<id> holds every file its manifest lists, with the listed sizes."""
    directory = state_dir / "versions" / version_id
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):
        return False
    return all(
        (directory / f["path"]).is_file() and (directory / f["path"]).stat().st_size == f["size"]
        for f in manifest["files"]
    )
