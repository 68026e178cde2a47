"""The agent daemon: enrol once, then check in, install what the control plane wants,
run inference and upload telemetry until told to stop."""

from __future__ import annotations

import base64
import logging
import random
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agent import __version__
from agent.client import GatewayClient
from agent.errors import AgentError, EnrolmentError
from agent.files import read_json, write_json_atomic
from agent.inference import InferenceLoop
from agent.install import Installer, Offer
from agent.outbox import Outbox
from deploy.errors import PackageRejected
from deploy.proto import agent_pb2

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    gateway: str
    state_dir: Path
    token: str = ""
    name: str = field(default_factory=socket.gethostname)
    labels: dict[str, str] = field(default_factory=dict)
    hardware: str = "generic"
    event_rate: float = 20.0
    metrics_interval: float = 5.0
    upload_interval: float = 2.0
    upload_batch: int = 500
    max_backoff: float = 60.0


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.client = GatewayClient(config.gateway)
        self.outbox = Outbox(config.state_dir / "outbox.sqlite")
        self.inference = InferenceLoop(rate=config.event_rate)
        self.stop_event = threading.Event()
        self.interval = 30.0
        self.installer: Installer | None = None
        self.failed_offers: set[str] = set()

    # --- identity -------------------------------------------------------------------
    @property
    def credential_file(self) -> Path:
        return self.config.state_dir / "credential.json"

    @property
    def state_file(self) -> Path:
        return self.config.state_dir / "running.json"

    def attributes(self) -> agent_pb2.DeviceAttributes:
        return agent_pb2.DeviceAttributes(
            hardware=self.config.hardware, os="linux", agent_version=__version__, labels=self.config.labels
        )

    def ensure_enrolled(self) -> None:
        saved = read_json(self.credential_file)
        if saved is None:
            if not self.config.token:
                raise EnrolmentError("not enrolled yet: pass --token with a one-time enrolment token")
            try:
                reply = self.client.enrol(self.config.token, self.config.name, self.attributes())
            except grpc.RpcError as exc:
                raise EnrolmentError(f"enrolment refused: {exc.details()}") from exc
            saved = {
                "device_id": reply.device_id,
                "credential": reply.credential,
                "release_public_key": base64.b64encode(reply.release_public_key).decode(),
                "gateway": self.config.gateway,
            }
            write_json_atomic(self.credential_file, saved, mode=0o600)  # the credential is a secret
            log.info("enrolled as device %s", reply.device_id)
        self.client.credential = saved["credential"]
        self.device_id = saved["device_id"]
        self.installer = Installer(
            self.config.state_dir, self.client, base64.b64decode(saved["release_public_key"])
        )

    # --- main loop --------------------------------------------------------------------
    def run(self) -> None:
        self.ensure_enrolled()
        self._resume_current()
        self.inference.start()
        threads = [
            threading.Thread(
                target=self._every,
                args=(self.config.metrics_interval, self.record_metrics),
                name="metrics",
                daemon=True,
            ),
            threading.Thread(
                target=self._every,
                args=(self.config.upload_interval, self.upload),
                name="upload",
                daemon=True,
            ),
        ]
        for t in threads:
            t.start()
        backoff = 1.0
        while not self.stop_event.is_set():
            try:
                self.check_in()
                backoff = 1.0
                wait = self.interval
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    log.error("the gateway refuses this device: %s", exc.details())
                backoff = min(self.config.max_backoff, backoff * 2)
                wait = backoff
                log.warning("check-in failed (%s); retrying in about %.0f s", exc.code().name, wait)
            self.stop_event.wait(wait * random.uniform(0.8, 1.2))  # jitter: fleets must not beat in step
        self.inference.stop()
        for t in threads:
            t.join(timeout=2)
        self.record_metrics()
        self.upload()

    def stop(self) -> None:
        self.stop_event.set()

    def _every(self, seconds: float, action) -> None:
        while not self.stop_event.wait(seconds):
            try:
                action()
            except grpc.RpcError as exc:
                log.info("%s deferred: gateway unreachable (%s)", action.__name__, exc.code().name)

    def _resume_current(self) -> None:
        version = self.installer.current_version()
        if version:
            self.inference.load(self.config.state_dir / "current", version)
            log.info("running version %s", version)

    def check_in(self) -> None:
        running = read_json(self.state_file, {})
        reply = self.client.check_in(
            self.attributes(), self.inference.version, running.get("package_digest", "")
        )
        self.interval = float(reply.checkin_interval_seconds or self.interval)
        if not reply.HasField("desired"):
            return
        d = reply.desired
        offer = Offer(
            d.release_id, d.version_id, d.version_label, d.model_name, d.package_digest, d.package_size
        )
        if offer.version_id == self.inference.version or offer.package_digest in self.failed_offers:
            return
        self.install(offer)

    def install(self, offer: Offer) -> None:
        log.info("installing %s:%s (%s)", offer.model_name, offer.version_label, offer.package_digest[:12])
        previous = self.inference.version
        try:
            self.installer.install(offer)
            self.inference.load(self.config.state_dir / "current", offer.version_id)
        except (AgentError, PackageRejected) as exc:
            self.failed_offers.add(offer.package_digest)
            log.error("update to %s refused: %s", offer.version_label, exc)
            self.outbox.append(
                "activation", {"ok": False, "version_id": offer.version_id, "reason": str(exc)}, previous
            )
            return
        write_json_atomic(
            self.state_file, {"version_id": offer.version_id, "package_digest": offer.package_digest}
        )
        self.outbox.append(
            "activation", {"ok": True, "version_id": offer.version_id, "from": previous}, offer.version_id
        )
        log.info("now running %s:%s", offer.model_name, offer.version_label)

    # --- telemetry ----------------------------------------------------------------------
    def record_metrics(self) -> None:
        version, figures = self.inference.take_figures()
        dropped = self.outbox.take_dropped()
        if dropped:
            figures["outbox_dropped"] = dropped
        if version or dropped:
            self.outbox.append("metrics", figures, version)

    def upload(self) -> None:
        while True:
            batch = self.outbox.batch(self.config.upload_batch)
            if not batch:
                return
            ack = self.client.report(batch)
            self.outbox.acknowledge(list(ack.stored_seqs) + list(ack.duplicate_seqs))
            if len(batch) < self.config.upload_batch:
                return
