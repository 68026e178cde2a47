"""The agent daemon: enrol once, then check in, drive the update lifecycle, run inference and
upload telemetry until told to stop.

Threads: the main loop (check-ins and the lifecycle), hints (a WatchHints stream that wakes
the main loop: push then pull), metrics, upload, and the inference loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent import __version__, identity
from agent.adapters import AdapterBook, AdapterHost
from agent.errors import EnrolmentError
from agent.files import read_json, write_json_atomic
from agent.inference import InferenceLoop
from agent.install import DownloadRules, Installer
from agent.lifecycle import IDLE, Lifecycle
from agent.metrics import ProcessMeter
from agent.metrics_export import MetricsExporter
from agent.outbox import Outbox
from agent.retry import Backoff
from agent.trust import AssignmentTrust, ReleaseKeys, SignedOffer, display_text
from agent.update_status import StatusBook, outcome_from_report, update_status
from deploy.proto import agent_pb2
from deploy.trust.rotation import RotationRefused

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    gateway: str  # overrides the enrolled gateway address when set
    state_dir: Path
    bundle: str = ""  # the enrolment bundle (ferry-enrol-1:...), first run only
    name: str = field(default_factory=socket.gethostname)
    labels: dict[str, str] = field(default_factory=dict)
    hardware: str = "generic"
    device_class: str = ""  # defaults to hardware: packages signed for another class are refused
    event_rate: float = 20.0
    metrics_interval: float = 5.0
    upload_interval: float = 2.0
    upload_batch: int = 500
    max_backoff: float = 60.0
    probation_seconds: float = 120.0
    outbox_max_records: int = 100_000
    download_rules: DownloadRules = field(default_factory=DownloadRules)
    watch_hints: bool = True
    metrics_textfile: Path | None = None  # opt-in local Prometheus export (agent/metrics_export.py)
    metrics_port: int = 0  # on 127.0.0.1 only
    llm_port: int = 0  # the active LLM package's chat API on 127.0.0.1 (agent/llm_api); 0: off
    llm_kv_cache: str | None = None  # "int8" or "fp32"; None: FERRY_LLM_KV_CACHE, the package's, fp32


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        # The engine's JIT kernels compile once per device, at activation (the health check's
        # Session), into the agent's state, so restarts and the first inference load them warm.
        # Read by the engine when it first compiles (it is imported lazily, after this).
        os.environ.setdefault("FERRY_JIT_CACHE", str(config.state_dir / "jit-cache"))
        self.client = None  # a GatewayClient with the device's certificate, once enrolled
        self.identity: identity.Identity | None = None
        self.outbox = Outbox(config.state_dir / "outbox.sqlite", max_records=config.outbox_max_records)
        self.inference = InferenceLoop(rate=config.event_rate, emit=self.outbox.append)
        self.meter = ProcessMeter(config.state_dir)
        # the active LLM and the LoRA adapters the fleet installed beside it (agent/adapters.py)
        self.llm = AdapterHost(AdapterBook(config.state_dir), config.llm_port, kv_cache=config.llm_kv_cache)
        self.assigned_adapter = ""  # the adapter version running.json names, while it is served
        self.exporter = (
            MetricsExporter(config.metrics_textfile, config.metrics_port)
            if config.metrics_textfile or config.metrics_port
            else None
        )
        self.stop_event = threading.Event()
        self.wake = threading.Event()  # set by a hint (or stop): check in now
        self.interval = 30.0
        self.installer: Installer | None = None
        self.lifecycle: Lifecycle | None = None
        self.activations = {"ok": 0, "failed": 0}
        self.hints_received = 0
        self.status_book = StatusBook(config.state_dir)
        # the assignment this device holds and needs nothing more from (Lifecycle.settled): sent at
        # check-in so the gateway answers "unchanged" instead of the same assignment again
        self.held_counter = 0

    # --- identity -------------------------------------------------------------------
    @property
    def credential_file(self) -> Path:
        return self.config.state_dir / "credential.json"

    @property
    def state_file(self) -> Path:
        return self.config.state_dir / "running.json"

    @property
    def device_class(self) -> str:
        return self.config.device_class or self.config.hardware

    def attributes(self) -> agent_pb2.DeviceAttributes:
        return agent_pb2.DeviceAttributes(
            hardware=self.config.hardware, os="linux", agent_version=__version__, labels=self.config.labels
        )

    def ensure_enrolled(self) -> None:
        saved = identity.load(self.config.state_dir)
        if saved is None:
            if not self.config.bundle:
                raise EnrolmentError(
                    "not enrolled yet: pass --bundle with the enrolment bundle (ferry-enrol-1:...)"
                )
            saved = identity.enrol(
                self.config.bundle, self.config.state_dir, self.config.name, self.attributes()
            )
        if self.config.gateway:
            saved.gateway = self.config.gateway
        self.identity = saved
        self.client = saved.client()
        self.device_id = saved.device_id
        self.interval = float(saved.checkin_interval_seconds or self.interval)
        self.release_keys = ReleaseKeys.load(self.config.state_dir, saved.release_public_keys)
        self.installer = Installer(
            self.config.state_dir,
            self.client,
            self.release_keys.keys[0],
            self.config.download_rules,
            trusted_keys=self.release_keys.keys,
        )
        self.lifecycle = Lifecycle(
            self.installer,
            device_class=self.device_class,
            organisation_id=saved.organisation_id,
            # the release keys came in the CA-signed enrolment grant; they sign packages and assignments
            trust=AssignmentTrust(  # the same list: a rotation taken is used at once
                self.config.state_dir, self.release_keys.keys, self.device_id, saved.organisation_id
            ),
            report=self._report_activation,
            on_version_change=self._load_version,
            probation_seconds=self.config.probation_seconds,
        )

    def _count_start(self) -> None:
        """Restarts are telemetry: a crash-looping agent shows up on the console."""
        path = self.config.state_dir / "agent.json"
        info = read_json(path, {}) or {}
        info["starts"] = int(info.get("starts", 0)) + 1
        info["agent_version"] = __version__
        write_json_atomic(path, info)

    def _take_restarts(self) -> tuple[int, int]:
        """(restarts since the last metrics record, restarts in total); the first start is not one."""
        path = self.config.state_dir / "agent.json"
        info = read_json(path, {}) or {}
        total = max(0, int(info.get("starts", 1)) - 1)
        new = total - int(info.get("restarts_reported", 0))
        if new:
            info["restarts_reported"] = total
            write_json_atomic(path, info)
        return new, total

    # --- main loop --------------------------------------------------------------------
    def run(self) -> None:
        self.ensure_enrolled()
        self._count_start()
        self.lifecycle.resume()
        self._load_version(self.installer.current_version())
        self.inference.start()
        threads = [
            threading.Thread(
                target=self._every, args=(self.config.metrics_interval, self.record_metrics), name="metrics"
            ),
            threading.Thread(
                target=self._every, args=(self.config.upload_interval, self.upload), name="upload"
            ),
        ]
        if self.config.watch_hints:
            threads.append(threading.Thread(target=self._watch_hints, name="hints"))
        threads.append(threading.Thread(target=self._renew_certificate, name="renew"))
        for t in threads:
            t.daemon = True
            t.start()
        self.lifecycle.advance()  # finish what a restart interrupted before asking for anything new
        # jitter on every wait, the regular interval too: a fleet does not check in in lockstep
        backoff = self._backoff(jitter=(0.8, 1.2))
        next_check_in, hinted = 0.0, False
        while not self.stop_event.is_set():
            if hinted or time.monotonic() >= next_check_in:
                try:
                    self.check_in(hinted=hinted)
                    backoff.reset()
                    wait = backoff.jittered(self.interval)
                except grpc.RpcError as exc:
                    if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                        log.error("the gateway refuses this device: %s", exc.details())
                    wait = backoff.failed()
                    log.warning("check-in failed (%s); retrying in %.0f s", exc.code().name, wait)
                    self.lifecycle.advance()  # a resumed update may still finish from what is on disk
                next_check_in = time.monotonic() + wait
            else:
                self.lifecycle.advance()  # a timer of the lifecycle (probation end, window, retry)
            timeout = max(0.0, min(next_check_in - time.monotonic(), self.lifecycle.wake_in()))
            hinted = self.wake.wait(timeout) and not self.stop_event.is_set()
            self.wake.clear()
        self.lifecycle.shutdown()
        self.inference.stop()
        self.llm.stop()
        for t in threads:
            t.join(timeout=2)
        self.record_metrics()
        try:
            self.upload()
        except grpc.RpcError:
            log.info("telemetry stays in the outbox until the next start (gateway unreachable)")
        self.client.close()
        if self.exporter is not None:
            self.exporter.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def _every(self, seconds: float, action) -> None:
        while not self.stop_event.wait(seconds):
            try:
                action()
            except grpc.RpcError as exc:
                log.info("%s deferred: gateway unreachable (%s)", action.__name__, exc.code().name)
            except Exception:  # a metrics or upload bug must not kill the thread that reports it
                log.exception("%s failed", action.__name__)

    def _backoff(self, jitter: tuple[float, float]) -> Backoff:
        """2 s after the first failure, doubling up to max_backoff."""
        cap = self.config.max_backoff
        return Backoff(first=min(2.0, cap), cap=cap, jitter=jitter)

    def _renew_certificate(self) -> None:
        """Renew the client certificate at two thirds of its lifetime; retry sooner on failure."""
        # at least a second between renewals, whatever lifetime the gateway issues
        while not self.stop_event.wait(max(1.0, identity.renewal_due_in(self.identity.certificate_pem))):
            try:
                identity.renew(self.config.state_dir, self.identity, self.client)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    log.error("the gateway refuses to renew this device's certificate: %s", exc.details())
                retry = min(60.0, max(1.0, identity.renewal_due_in(self.identity.certificate_pem) * -0.1))
                log.warning("certificate renewal failed (%s); retrying in %.0f s", exc.code().name, retry)
                if self.stop_event.wait(retry):
                    return
            except EnrolmentError as exc:
                log.error("%s", exc)
                if self.stop_event.wait(60.0):
                    return

    def _watch_hints(self) -> None:
        backoff = self._backoff(jitter=(0.5, 1.0))
        while not self.stop_event.is_set():
            stream, failed = None, False
            try:
                stream = self.client.watch(self.running_version)
                for hint in stream:
                    backoff.reset()
                    self.hints_received += 1
                    log.info("hint from the gateway (%s): checking in now", hint.reason)
                    self.wake.set()
                    if self.stop_event.is_set():
                        break
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("the gateway pushes no hints; polling only")
                    return
                # a stream that ran to its deadline is a working link, not a failure
                failed = exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED
            finally:
                if stream is not None:
                    stream.cancel()
            if failed:
                backoff.wait_after_failure(self.stop_event)
            else:  # reopen soon, at the pace the last failures set
                self.stop_event.wait(backoff.jittered(backoff.current))

    @property
    def running_version(self) -> str:
        """What the device reports it runs: the assigned adapter (served beside its base), else
        the active version."""
        return self.assigned_adapter or self.llm.version or self.inference.version

    def _load_version(self, version_id: str) -> None:
        directory = self.config.state_dir / "current"
        is_llm = self.llm.load(directory, version_id)  # an LLM answers chat requests, not events
        self.inference.load(directory, "" if is_llm else version_id)
        assigned = (read_json(self.state_file, {}) or {}).get("version_id", "")
        served = {a.version_id for a in self.llm.served_adapters().values()} if is_llm else set()
        self.assigned_adapter = assigned if assigned in served else ""
        if version_id:
            log.info(
                "running version %s%s", version_id, f" with adapter {assigned}" * bool(self.assigned_adapter)
            )

    def check_in(self, hinted: bool = False) -> None:
        running = read_json(self.state_file, {}) or {}
        reply = self.client.check_in(
            self.attributes(),
            self.running_version,
            running.get("package_digest", ""),
            update=self.update_status(),
            held_assignment_counter=self.held_counter if self.lifecycle.state == IDLE else 0,
            hinted=hinted,
            key_rotation_sequence=self.release_keys.reported_sequence,
        )
        self.interval = float(reply.checkin_interval_seconds or self.interval)
        if reply.key_rotation_chain or reply.HasField("key_rotation"):
            self.take_key_rotations(reply)
        offer = None
        if reply.HasField("desired"):
            offer = self.lifecycle.offer_signed(offer_from(reply.desired))
        self.lifecycle.advance()
        if not reply.desired_unchanged:  # unchanged: what this device holds is still its assignment
            self.held_counter = self.lifecycle.settled(offer)

    def take_key_rotations(self, reply: agent_pb2.CheckInResponse) -> None:
        """Trust the rotated release keys if each link of the chain is signed by the keys trusted
        at that step; else keep the old ones (a gateway without chains sends only the latest)."""
        chain = reply.key_rotation_chain or [reply.key_rotation]
        try:
            rotations = self.release_keys.take_chain([(link.rotation, link.signature) for link in chain])
        except RotationRefused as exc:
            why = (
                f"; the control plane says {reply.key_rotation_refused}" if reply.key_rotation_refused else ""
            )
            log.warning("release-key rotation refused (%s): %s; trusted keys unchanged%s", exc.code, exc, why)
            return
        if rotations:
            self.installer.public_key = rotations[-1].keys[0]
            for rotation in rotations:
                log.info(
                    "release keys rotated to set %d (%s)", rotation.sequence, rotation.keys[0].hex()[:16]
                )

    def take_key_rotation(self, message: agent_pb2.KeyRotation) -> None:
        """One rotation as an older gateway sends it (the latest only)."""
        self.take_key_rotations(agent_pb2.CheckInResponse(key_rotation=message))

    def update_status(self) -> agent_pb2.UpdateStatus:
        """Where the update stands for the control plane: in progress, or how the last one ended."""
        update = self.lifecycle.update
        return update_status(
            lifecycle_state=update.state,
            offer=update.current_offer,
            counter=update.counter,
            entered_at=update.entered_at,
            running_version=self.running_version,
            latest=self.status_book.latest(),
        )

    # --- telemetry ----------------------------------------------------------------------
    def _report_activation(self, kind: str, payload: dict[str, Any], version_id: str) -> None:
        self.activations["ok" if payload.get("ok") else "failed"] += 1
        update = self.lifecycle.update  # still on the offer: the lifecycle reports before it moves on
        outcome = outcome_from_report(payload, update.current_offer, update.counter)
        if outcome is not None:
            self.status_book.record(outcome)
        self.outbox.append(kind, payload, version_id)

    def record_metrics(self) -> None:
        version, figures = self.inference.take_figures()
        if self.llm.version:
            version = self.llm.version
            figures.update(self.llm.take_figures())
        restarts, restarts_total = self._take_restarts()
        figures.update(self.meter.read())
        figures.update(
            {
                "version": version,
                "restarts": restarts,
                "restarts_total": restarts_total,
                "activations_ok": self.activations["ok"],
                "activations_failed": self.activations["failed"],
                "update_state": self.lifecycle.state if self.lifecycle else IDLE,
                "outbox_pending": self.outbox.pending(),
            }
        )
        self.activations = {"ok": 0, "failed": 0}
        dropped = self.outbox.take_dropped()
        if dropped:
            figures["outbox_dropped"] = dropped
        figures["outbox_dropped_total"] = self.outbox.dropped_total()
        figures["outbox_rejected_total"] = self.outbox.rejected_total()
        self.outbox.append("metrics", figures, version)
        self._record_adapter_metrics(version)
        if self.exporter is not None:
            device_id = getattr(self, "device_id", "")
            self.exporter.observe(figures, device_id=device_id, hints_received=self.hints_received)

    def _record_adapter_metrics(self, base_version: str) -> None:
        """One metrics record per served adapter, under the adapter's own version, so the control
        plane reads its requests, tokens and errors by version and adapter like any version's."""
        for adapter, figures in self.llm.take_adapter_figures():
            figures.update(
                {"version": adapter.version_id, "adapter": adapter.name, "base_version": base_version}
            )
            self.outbox.append("metrics", figures, adapter.version_id)

    def upload(self) -> None:
        while True:
            batch = self.outbox.batch(self.config.upload_batch)
            if not batch:
                return
            try:
                ack = self.client.report(batch)
            except BaseException:
                self.outbox.release_in_flight()
                raise
            rejected = {r.seq: r.reason for r in ack.rejected}  # never valid: dropped, not re-sent
            self.outbox.acknowledge(list(ack.stored_seqs) + list(ack.duplicate_seqs), rejected)
            if len(batch) < self.config.upload_batch:
                return


def offer_from(d: agent_pb2.PackageOffer) -> SignedOffer:
    """The offer as received: only its signed assignment is acted on (Lifecycle.offer_signed);
    the gateway's other fields are display text, bounded here."""
    return SignedOffer(
        assignment=bytes(d.assignment),
        signature=bytes(d.assignment_signature),
        version_label=display_text(d.version_label),
        model_name=display_text(d.model_name),
    )
