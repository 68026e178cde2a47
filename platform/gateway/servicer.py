"""The agents' gRPC door: authenticate, then hand over to fleet/releases/telemetry services.

Domain errors the services raise are left to rise: gateway.errors.DomainErrorInterceptor
(installed by gateway.server) turns them into gRPC statuses for every method."""

from __future__ import annotations

import json
import logging
import queue
import time
from collections.abc import Iterator

import grpc
from django.conf import settings
from django.db import close_old_connections, connection
from ferry_cloud.release_key import release_public_key
from fleet.models import Device
from fleet.services import device_authenticate, device_enrol, device_record_check_in
from registry import storage
from registry.models import Artifact
from releases.assignments import assignment_for, package_assigned_to
from telemetry.services import IncomingRecord, telemetry_ingest

from deploy.proto import agent_pb2, agent_pb2_grpc
from gateway.hints import HintHub

log = logging.getLogger(__name__)
CHUNK_BYTES = 256 * 1024
MAX_BATCH = 1000
# A watch stream ends after this long; the agent reopens it (keeps dead peers from holding threads).
WATCH_MAX_SECONDS = 300.0
WATCH_TICK_SECONDS = 5.0


def _attributes(message: agent_pb2.DeviceAttributes) -> tuple[dict[str, str], dict[str, str]]:
    attributes = {"hardware": message.hardware, "os": message.os, "agent_version": message.agent_version}
    return {k: v for k, v in attributes.items() if v}, dict(message.labels)


def _device(context: grpc.ServicerContext) -> Device:
    metadata = dict(context.invocation_metadata())
    scheme, _, credential = metadata.get("authorization", "").partition(" ")
    if scheme != "Bearer" or not credential:
        context.abort(
            grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization: Bearer <credential>' metadata"
        )
    return device_authenticate(credential=credential)  # refusals: gateway.errors' interceptor


class AgentGatewayServicer(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(self, hub: HintHub | None = None) -> None:
        self.hub = hub or HintHub.from_settings()

    def Enrol(self, request, context):
        close_old_connections()
        attributes, labels = _attributes(request.attributes)
        enrolment = device_enrol(token=request.token, name=request.name, attributes=attributes, labels=labels)
        log.info("device %s enrolled as %s", enrolment.device.name, enrolment.device.pk)
        return agent_pb2.EnrolResponse(
            device_id=str(enrolment.device.pk),
            credential=enrolment.credential,
            release_public_key=release_public_key(),
            checkin_interval_seconds=settings.FERRY_CHECKIN_INTERVAL_SECONDS,
            organisation_id=str(enrolment.device.organisation_id),
        )

    def CheckIn(self, request, context):
        close_old_connections()
        device = _device(context)
        attributes, _ = _attributes(request.attributes)
        device = device_record_check_in(
            device=device, attributes=attributes, running_version_id=request.running_version_id
        )
        response = agent_pb2.CheckInResponse(checkin_interval_seconds=settings.FERRY_CHECKIN_INTERVAL_SECONDS)
        issued = assignment_for(device)
        if issued is not None:
            desired, version = issued.desired, issued.desired.version
            window = agent_pb2.MaintenanceWindow(**desired.window) if desired.window else None
            # the descriptive fields are for display: the agent acts on the signed assignment alone
            response.desired.CopyFrom(
                agent_pb2.PackageOffer(
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
            )
        return response

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
        with storage.open_at(artifact.file.name, offset) as stream:
            while offset < artifact.size:
                data = stream.read(min(CHUNK_BYTES, artifact.size - offset))
                if not data:
                    break
                yield agent_pb2.PackageChunk(offset=offset, data=data, total_size=artifact.size)
                offset += len(data)

    def ReportTelemetry(self, request, context):
        close_old_connections()
        device = _device(context)
        if len(request.records) > MAX_BATCH:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_BATCH} records per batch")
        records = []
        for r in request.records:
            try:
                payload = json.loads(r.payload_json or "{}")
            except ValueError:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"record {r.seq}: payload_json is not JSON")
            if not isinstance(payload, dict):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"record {r.seq}: payload must be an object")
            records.append(IncomingRecord(r.seq, r.kind, r.timestamp, r.version_id, payload))
        result = telemetry_ingest(device=device, records=records)
        return agent_pb2.TelemetryAck(stored_seqs=result.stored, duplicate_seqs=result.duplicates)

    def WatchHints(self, request, context) -> Iterator[agent_pb2.Hint]:
        """Hold the stream open and push a Hint whenever the device's organisation's releases change."""
        close_old_connections()
        device = _device(context)
        organisation_id = device.organisation_id
        hints = self.hub.subscribe(organisation_id)
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
                yield agent_pb2.Hint(reason=reason)
        finally:
            self.hub.unsubscribe(organisation_id, hints)
