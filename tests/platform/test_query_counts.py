"""Every REST read answers in a fixed number of SQL queries, whatever the number of rows: each
endpoint's count is pinned, and it must not change when the organisation grows."""

from __future__ import annotations

import io
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from fleet.services import device_enrol, device_group_create, device_record_check_in, enrolment_token_create
from registry.services import model_create, version_upload
from releases.services import release_create
from telemetry.services import IncomingRecord, telemetry_ingest

from tests.platform.conftest import onnx_bytes

# Queries per GET: two are authentication (the token with its user, the membership with its
# organisation). Change a number only with the reason in the commit message.
PINNED = {
    "models/": 4,
    "models/{model}/": 4,
    "versions/{version}/": 3,
    "devices/": 3,
    "device-groups/": 5,
    "device-groups/{group}/": 4,
    "releases/": 5,
    "releases/{release}/": 6,  # + the per-device states (releases.selectors.release_device_statuses)
    "releases/{release}/devices/": 4,
    "fleet/summary/": 5,
    "versions/": 3,
    "models/{model}/versions/": 4,
    "devices/{device}/": 4,
    "enrolment-tokens/": 3,
    "releases/{release}/events/": 4,
    "audit/": 3,
    "devices/{device}/telemetry/": 4,
    "conversion-jobs/": 3,
    "conversion-jobs/{job}/": 3,
}


def _grow(org, version, *, devices: int, models: int, tag: str) -> dict[str, str]:
    """Add devices that run ``version`` and report telemetry, models with versions, a group and a
    release; returns ids for the detail endpoints."""
    enrolled = []
    for i in range(devices):
        token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
        device = device_enrol(token=token, name=f"{tag}-{i}", attributes={"hw": "pi"}, labels={}).device
        device = device_record_check_in(
            device=device, attributes={"hw": "pi"}, running_version_id=str(version.pk)
        )
        payload = {"inferences": 10, "errors": 0, "latency_ms_p50": 1.0, "latency_ms_p95": 2.0}
        telemetry_ingest(
            device=device, records=[IncomingRecord(1, "metrics", time.time(), str(version.pk), payload)]
        )
        enrolled.append(device)
    model = None
    for m in range(models):
        model = model_create(organisation=org, name=f"{tag}-model-{m}")
        for label in ("a", "b"):
            data = onnx_bytes()
            version_upload(model=model, label=label, stream=io.BytesIO(data), size=len(data))
    group = device_group_create(
        organisation=org, name=f"{tag}-group", kind="static", device_ids=[str(d.pk) for d in enrolled]
    )
    device_group_create(organisation=org, name=f"{tag}-pis", kind="dynamic", filter_text="hw == pi")
    release = release_create(
        organisation=org,
        version=version,
        name=f"{tag}-release",
        target={"device_ids": [str(enrolled[0].pk)]},
    )
    return {
        "model": str(model.pk),
        "group": str(group.pk),
        "release": str(release.pk),
        "version": str(version.pk),
        "device": str(enrolled[-1].pk),
        "job": str(version.job.pk),
    }


def _counts(api, ids: dict[str, str]) -> dict[str, int]:
    counts = {}
    for template in PINNED:
        path = "/api/v1/" + template.format(**ids)
        with CaptureQueriesContext(connection) as queries:
            response = api.get(path)
        assert response.status_code == 200, (path, response.content[:300])
        counts[template] = len(queries)
    return counts


@pytest.mark.django_db
def test_reads_do_not_grow_with_the_fleet_and_are_pinned(api, org, ready_version):
    small = _counts(api, _grow(org, ready_version, devices=1, models=1, tag="small"))
    large = _counts(api, _grow(org, ready_version, devices=6, models=4, tag="large"))
    assert large == small, {k: (small[k], large[k]) for k in small if small[k] != large[k]}
    assert small == PINNED
