"""The agents' gRPC door: authenticate, then hand over to fleet/releases/telemetry services.

A device is whoever its verified client certificate names (gateway.tls.peer_device_id),
never a message field or metadata; Enrol is the one call that needs no certificate.

Domain errors the services raise are left to rise: gateway.errors.DomainErrorInterceptor
(installed by gateway.server) turns them into gRPC statuses for every method."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterator

import grpc
from django.conf import settings
from django.db import close_old_connections, connection
from ferry_cloud.device_ca import device_ca
from ferry_cloud.release_key import current_rotation, rotations_after, trusted_public_keys
from fleet.models import Device
from fleet.services import (
    device_enrol,
    device_for_certificate,
    device_record_check_in,
    device_renew_certificate,
)
from registry import storage
from registry.models import Artifact
from releases.assignments import assignment_for, package_assigned_to
from releases.device_status import device_status_record, update_report_from
from telemetry.schema import check_batch, validate_batch
from telemetry.services import telemetry_ingest

from deploy.proto import agent_pb2, agent_pb2_grpc
from deploy.trust.certificates import certificate_der, sign
from gateway.checkin_fast import Answer, KnownDevices, answer_with
from gateway.desired_cache import fleet_generation
from gateway.hints import HintHub, StreamClosed
from gateway.tls import peer_device_id

log = logging.getLogger(__name__)
CHUNK_BYTES = 256 * 1024
# A watch stream ends after this long; the agent reopens it (keeps dead peers from holding threads).
WATCH_MAX_SECONDS = 300.0
WATCH_TICK_SECONDS = 5.0
# A download in progress looks up whether its device was revoked at most this often (one indexed
# query), so revocation cuts a running transfer within about this long plus one chunk.
DOWNLOAD_REVOCATION_CHECK_SECONDS = 1.0


def _attributes(message: agent_pb2.DeviceAttributes) -> tuple[dict[str, str], dict[str, str]]:
    attributes = {"hardware": message.hardware, "os": message.os, "agent_version": message.agent_version}
    return {k: v for k, v in attributes.items() if v}, dict(message.labels)


def _device(context: grpc.ServicerContext) -> Device:
    device_id = peer_device_id(context)
    if device_id is None:
        context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "this call needs the device's client certificate: enrol first, then use the mutual-TLS port",
        )
    return device_for_certificate(device_id=device_id)  # refusals: gateway.errors' interceptor


def _abort_if_revoked(device: Device, context: grpc.ServicerContext) -> None:
    """End a running stream with PERMISSION_DENIED once its device has been revoked."""
    if Device.objects.filter(pk=device.pk, revoked_at__isnull=False).exists():
        log.info("device %s was revoked: its download in progress is cut", device.pk)
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            "This device has been revoked; enrol it again with a new token.",
        )


def _update_report(request: agent_pb2.CheckInRequest):
    """The check-in's UpdateStatus, validated (InvalidUpdateStatus -> INVALID_ARGUMENT naming the
    field); None from an agent that sends none."""
    if not request.HasField("update"):
        return None
    u = request.update
    return update_report_from(
        state=u.state,
        version_id=u.version_id,
        release_id=u.release_id,
        assignment_counter=u.assignment_counter,
        reason_code=u.reason_code,
        message=u.message,
        at=u.at,
    )


def _offer(device: Device) -> Answer:
    """The serialized PackageOffer for the device (None: nothing decided for it), its assignment's
    counter, and until when that signed assignment may be handed out again."""
    issued = assignment_for(device)
    if issued is None:
        return Answer(None, 0, time.time() + 3600.0)
    desired, version = issued.desired, issued.desired.version
    window = agent_pb2.MaintenanceWindow(**desired.window) if desired.window else None
    # the descriptive fields are for display: the agent acts on the signed assignment alone
    offer = agent_pb2.PackageOffer(
        release_id=str(desired.release.pk) if desired.release else "",
        version_id=str(version.pk),
        version_label=version.label,
        model_name=version.model.name,
        package_digest=version.package.sha256,
        package_size=version.package.size,
        download_only=desired.download_only,
        rollback=desired.rollback,
        window=window,
        assignment=issued.blob,
        assignment_signature=issued.signature,
    )
    return Answer(offer.SerializeToString(), issued.counter, issued.fresh_until)


def add_key_rotations(response: agent_pb2.CheckInResponse, held_sequence: int) -> None:
    """The latest rotation (for agents that read only it: they skip a known one) and the chain of
    every rotation above the one the device holds, so a device offline through several catches up."""
    rotation = current_rotation()
    if rotation is None:
        return
    response.key_rotation.rotation, response.key_rotation.signature = rotation
    chain, too_far_behind = rotations_after(held_sequence)
    for blob, signature in chain:
        response.key_rotation_chain.add(rotation=blob, signature=signature)
    if too_far_behind:  # sent anyway: a device enrolled after them recognises its own keys in it
        response.key_rotation_refused = "reenrol_required"


class AgentGatewayServicer(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(self, hub: HintHub | None = None) -> None:
        self.hub = hub or HintHub.from_settings()
        self.known = KnownDevices(settings.FERRY_CHECKIN_INTERVAL_SECONDS)

    def Enrol(self, request, context):
        close_old_connections()
        if not request.csr:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Enrol needs a CSR for the device's own key")
        attributes, labels = _attributes(request.attributes)
        enrolment = device_enrol(
            token=request.token, name=request.name, attributes=attributes, labels=labels, csr_der=request.csr
        )
        log.info("device %s enrolled as %s", enrolment.device.name, enrolment.device.pk)
        grant = agent_pb2.EnrolGrant(
            device_id=str(enrolment.device.pk),
            organisation_id=str(enrolment.device.organisation_id),
            client_certificate=certificate_der(enrolment.certificate.certificate_pem),
            release_public_keys=trusted_public_keys(),  # the set rotated devices hold too
            checkin_interval_seconds=settings.FERRY_CHECKIN_INTERVAL_SECONDS,
        ).SerializeToString()
        # signed with the CA key the agent pinned from its bundle: a gateway of another CA cannot
        # hand it another release key
        return agent_pb2.EnrolResponse(grant=grant, signature=sign(device_ca().key_pem, grant))

    def Renew(self, request, context):
        close_old_connections()
        device = _device(context)
        issued = device_renew_certificate(device=device, csr_der=request.csr)
        log.info("device %s renewed its certificate until %s", device.pk, issued.not_after.isoformat())
        return agent_pb2.RenewResponse(client_certificate=certificate_der(issued.certificate_pem))

    def CheckIn(self, request, context):
        """Answered from memory when nothing changed (gateway.checkin_fast: no SQL), else computed."""
        device_id = peer_device_id(context)
        response = self.known.answer(device_id, request) if device_id else None
        if response is None:
            response = self._computed_check_in(request, context)
        add_key_rotations(response, request.key_rotation_sequence)
        return response

    def _computed_check_in(self, request, context) -> agent_pb2.CheckInResponse:
        close_old_connections()
        epoch = self.known.epoch  # before the device row is read: see KnownDevices.remember
        organisation_id = self.known.organisation_of(peer_device_id(context))
        if organisation_id is None:  # the device's first check-in here: learn its organisation
            organisation_id = _device(context).organisation_id
        # read before the device row and the fleet are: a change committed after this bumps it,
        # so an answer computed from older facts is never remembered as current
        generation = fleet_generation(organisation_id)
        device = _device(context)
        if device.organisation_id != organisation_id:
            generation = None
        report = _update_report(request)  # checked before anything is stored
        attributes, _ = _attributes(request.attributes)
        device = device_record_check_in(
            device=device,
            attributes=attributes,
            running_version_id=request.running_version_id,
            release_key_sequence=request.key_rotation_sequence,
        )
        if report is not None:
            device_status_record(device=device, report=report)
        answer = self.known.reusable(device, generation) or _offer(device)
        self.known.remember(device, request, generation, answer, epoch)
        response = agent_pb2.CheckInResponse(checkin_interval_seconds=settings.FERRY_CHECKIN_INTERVAL_SECONDS)
        return answer_with(response, answer, request)

    def DownloadPackage(self, request, context) -> Iterator[agent_pb2.PackageChunk]:
        close_old_connections()
        device = _device(context)
        if not package_assigned_to(device, request.package_digest):
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"package {request.package_digest[:64]!r} was never assigned to this device",
            )
        artifact = Artifact.objects.filter(
            organisation=device.organisation, kind=Artifact.Kind.PACKAGE, sha256=request.package_digest
        ).first()
        if artifact is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no package {request.package_digest} for this device")
        if request.offset > artifact.size:
            context.abort(grpc.StatusCode.OUT_OF_RANGE, f"offset {request.offset} is past the package's end")
        offset = request.offset
        next_check = time.monotonic() + DOWNLOAD_REVOCATION_CHECK_SECONDS
        with storage.open_at(artifact.file.name, offset) as stream:
            while offset < artifact.size:
                if time.monotonic() >= next_check:
                    _abort_if_revoked(device, context)
                    next_check = time.monotonic() + DOWNLOAD_REVOCATION_CHECK_SECONDS
                data = stream.read(min(CHUNK_BYTES, artifact.size - offset))
                if not data:
                    break
                yield agent_pb2.PackageChunk(offset=offset, data=data, total_size=artifact.size)
                offset += len(data)

    def ReportTelemetry(self, request, context):
        """Store the batch's valid records exactly once; refuse each invalid one with its reason."""
        close_old_connections()
        device = _device(context)
        check_batch(records=len(request.records), message_bytes=request.ByteSize())  # Invalid: whole call
        valid, refused = validate_batch(request.records)
        rejected = [agent_pb2.RejectedRecord(seq=seq, reason=reason) for seq, reason in refused]
        if rejected:
            log.info(
                "device %s: %d telemetry records refused, e.g. %r",
                device.pk,
                len(rejected),
                rejected[0].reason,
            )
        result = telemetry_ingest(device=device, records=valid)  # committed before we acknowledge
        return agent_pb2.TelemetryAck(
            stored_seqs=result.stored, duplicate_seqs=result.duplicates, rejected=rejected
        )

    def WatchHints(self, request, context) -> Iterator[agent_pb2.Hint]:
        """Hold the stream open and push a Hint whenever the device's organisation's releases change.

        One stream per device: opening another closes this one (ABORTED); revoking the device
        closes it (PERMISSION_DENIED)."""
        close_old_connections()
        device = _device(context)
        organisation_id = device.organisation_id
        hints = self.hub.subscribe(organisation_id, str(device.pk))
        connection.close()  # a long-lived stream must not hold a database connection
        if hints is None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many open watch streams; keep polling")
        context.add_callback(lambda: self.hub.unsubscribe(organisation_id, hints))
        deadline = time.monotonic() + WATCH_MAX_SECONDS
        try:
            while context.is_active() and time.monotonic() < deadline:
                try:
                    reason = hints.get(timeout=WATCH_TICK_SECONDS)
                except queue.Empty:
                    continue
                if isinstance(reason, StreamClosed):
                    code = grpc.StatusCode.PERMISSION_DENIED if reason.revoked else grpc.StatusCode.ABORTED
                    context.abort(code, reason.message)
                yield agent_pb2.Hint(reason=reason)
        finally:
            self.hub.unsubscribe(organisation_id, hints)
