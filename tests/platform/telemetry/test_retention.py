"""Retention: old raw telemetry becomes hourly per-version rollups and is deleted, once."""

from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone
from fleet.services import device_enrol, enrolment_token_create
from telemetry.models import TelemetryRecord, TelemetryRollup
from telemetry.retention import telemetry_roll_up_and_prune
from telemetry.services import IncomingRecord, telemetry_ingest
from telemetry.tasks import roll_up_old_telemetry


def _device(org, name):
    return device_enrol(
        token=enrolment_token_create(organisation=org).token, name=name, attributes={}, labels={}
    ).device


def _age(device, seqs, when):
    TelemetryRecord.objects.filter(device=device, seq__in=seqs).update(received_at=when)


def test_old_telemetry_is_rolled_up_per_version_and_hour_then_pruned(org, settings):
    settings.FERRY_TELEMETRY_RAW_DAYS = 7
    a, b = _device(org, "a"), _device(org, "b")
    metrics = {"inferences": 100, "errors": 2, "restarts": 1, "latency_ms_p95": 4.0}
    for device in (a, b):
        telemetry_ingest(
            device=device,
            records=[
                IncomingRecord(1, "metrics", time.time(), "7", metrics),
                IncomingRecord(2, "metrics", time.time(), "7", {**metrics, "latency_ms_p95": 8.0}),
                IncomingRecord(3, "activation", time.time(), "7", {"ok": True}),
                IncomingRecord(
                    4, "metrics", time.time(), "8", {"inferences": "lots"}
                ),  # stored before the schema
                IncomingRecord(5, "event", time.time(), "7", {"pipeline": 1}),
                IncomingRecord(6, "metrics", time.time(), "7", metrics),  # recent: stays raw
            ],
        )
    old = timezone.now() - timedelta(days=10)
    hour = old.replace(minute=0, second=0, microsecond=0)
    for device in (a, b):
        _age(device, [1, 3, 4, 5], hour + timedelta(minutes=5))
        _age(device, [2], hour + timedelta(hours=1, minutes=1))  # the next hour

    result = telemetry_roll_up_and_prune()
    assert (result.hours, result.pruned) == (2, 10)
    assert sorted(TelemetryRecord.objects.filter(device=a).values_list("seq", flat=True)) == [6]
    first = TelemetryRollup.objects.get(organisation=org, version_id="7", hour=hour)
    assert (first.records, first.devices, first.metrics_records) == (6, 2, 2)
    assert (first.inferences, first.errors, first.restarts) == (200, 4, 2)
    assert (first.activations_ok, first.activations_failed, first.events) == (2, 0, 2)
    assert first.latency_ms_p95_median == 4.0
    broken = TelemetryRollup.objects.get(organisation=org, version_id="8", hour=hour)
    assert (broken.records, broken.records_skipped, broken.inferences) == (2, 2, 0)
    second = TelemetryRollup.objects.get(organisation=org, version_id="7", hour=hour + timedelta(hours=1))
    assert (second.records, second.inferences, second.latency_ms_p95_median) == (2, 200, 8.0)

    # a second run (or the beat task) finds nothing old: nothing counted twice
    assert roll_up_old_telemetry() == 0
    assert TelemetryRollup.objects.get(pk=first.pk).records == 6
    assert TelemetryRollup.objects.count() == 3


def test_a_run_does_at_most_max_hours(org, settings):
    settings.FERRY_TELEMETRY_RAW_DAYS = 1
    device = _device(org, "c")
    telemetry_ingest(
        device=device, records=[IncomingRecord(s, "event", time.time(), "", {}) for s in (1, 2, 3)]
    )
    start = (timezone.now() - timedelta(days=3)).replace(minute=30)
    for seq in (1, 2, 3):
        _age(device, [seq], start + timedelta(hours=seq))
    assert telemetry_roll_up_and_prune(max_hours=2).pruned == 2
    assert telemetry_roll_up_and_prune(max_hours=2).pruned == 1
    assert not TelemetryRecord.objects.filter(device=device).exists()
