"""The gate's failed activations, gathered in the same pass as its cohort figures
(telemetry.selectors.release_gate_telemetry), equal the separate query the gate ran before: each
cohort device's latest activation record about the version, by (received_at, id), if a failure."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone
from fleet.models import Device
from telemetry.models import TelemetryRecord
from telemetry.selectors import release_gate_telemetry

VERSION = "v-7"


def _separate_query(device_ids: set[str], since) -> dict[str, str]:
    """The reading the gate made on its own query (the former telemetry.selectors.failed_activations)."""
    rows = (
        TelemetryRecord.objects.filter(
            kind="activation", device_id__in=device_ids, received_at__gte=since, payload__version_id=VERSION
        )
        .order_by("received_at", "pk")
        .values_list("device_id", "payload")
    )
    latest = {str(device_id): payload for device_id, payload in rows if isinstance(payload, dict)}
    return {
        device: str(payload.get("code") or payload.get("stage") or "")
        for device, payload in latest.items()
        if payload.get("ok") is False
    }


def _payload(rng: random.Random) -> object:
    about = rng.choice([VERSION, VERSION, "v-8", None])
    payload = {"ok": rng.choice([True, False, False, None]), "code": rng.choice(["", "E_SHAPE", "E_MEM"])}
    if about is not None:
        payload["version_id"] = about
    if rng.random() < 0.2:
        payload["stage"] = "load"
    if rng.random() < 0.1:
        payload["latency_ms_p95"] = "fast"  # not well formed: the cohort skips it, a failure still reads
    return payload if rng.random() < 0.95 else ["not", "a", "dict"]


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(4))
def test_failures_in_the_same_pass_equal_the_separate_query(org, seed):
    rng = random.Random(seed)
    devices = [Device.objects.create(organisation=org, name=f"d{i}") for i in range(8)]
    now = timezone.now()
    for seq in range(60):
        record = TelemetryRecord.objects.create(
            device=rng.choice(devices),
            seq=seq,
            kind=rng.choice(["activation", "activation", "metrics"]),
            timestamp=now,
            version_id=rng.choice([VERSION, "v-8"]),
            payload=_payload(rng),
        )
        # receipt order not the id order, and ties broken by the id; some before the window
        received = now - timedelta(minutes=rng.choice([0, 1, 2, 2, 30]))
        TelemetryRecord.objects.filter(pk=record.pk).update(received_at=received)
    cohort = {str(d.pk) for d in rng.sample(devices, k=5)}
    since = now - timedelta(minutes=10)
    read = release_gate_telemetry(organisation_id=org.pk, version_id=VERSION, since=since, device_ids=cohort)
    expected = _separate_query(cohort, since)
    assert read.failed_activations == expected
    assert expected  # the records made failures to find (fixed by the seed)
