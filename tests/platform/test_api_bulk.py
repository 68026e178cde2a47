"""POST /api/v1/devices/bulk/: pin, unpin, label or revoke by filter or ids, with a dry-run count."""

from __future__ import annotations

import pytest
from fleet import bulk
from fleet.models import BulkAction, Device
from fleet.services import device_enrol, enrolment_token_create
from rest_framework.test import APIClient

URL = "/api/v1/devices/bulk/"


def _fleet(org, sites=("lab", "lab", "lab", "field")) -> list[Device]:
    devices = []
    for i, site in enumerate(sites):
        token = enrolment_token_create(organisation=org, labels={"site": site}).token
        devices.append(device_enrol(token=token, name=f"cam-{i}", attributes={"hw": "pi"}, labels={}).device)
    return devices


def _as(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.mark.django_db
def test_a_dry_run_counts_and_a_pin_by_filter_changes_only_what_it_must(api, org, admin, ready_version):
    devices = _fleet(org)
    pin = {"filter": "labels.site == lab", "action": "pin", "version": str(ready_version.pk)}
    dry = api.post(URL, {**pin, "dry_run": True}, format="json")
    assert dry.status_code == 200, dry.content
    assert dry.json() == {"matched": 3, "changed": 3, "dry_run": True}
    assert not Device.objects.filter(pinned_version__isnull=False).exists()
    assert not BulkAction.objects.exists()  # a dry run changes and audits nothing

    done = api.post(URL, pin, format="json", HTTP_IDEMPOTENCY_KEY="pin-lab-1")
    assert done.json() == {"matched": 3, "changed": 3, "dry_run": False}
    pinned = set(Device.objects.filter(pinned_version=ready_version).values_list("name", flat=True))
    assert pinned == {"cam-0", "cam-1", "cam-2"}
    replay = api.post(URL, pin, format="json", HTTP_IDEMPOTENCY_KEY="pin-lab-1")
    assert replay["Idempotent-Replayed"] == "true" and replay.json()["changed"] == 3
    assert api.post(URL, pin, format="json").json()["changed"] == 0  # already pinned
    audit = BulkAction.objects.order_by("at", "id")
    assert [(a.action, a.matched, a.changed, a.actor_id) for a in audit] == [
        ("pin", 3, 3, admin[0].pk),
        ("pin", 3, 0, admin[0].pk),
    ]

    ids = [str(devices[0].pk), str(devices[3].pk)]
    unpin = api.post(URL, {"device_ids": ids, "action": "unpin"}, format="json")
    assert unpin.json() == {"matched": 2, "changed": 1, "dry_run": False}
    assert Device.objects.filter(pinned_version__isnull=False).count() == 2


@pytest.mark.django_db
def test_labels_merge_and_null_removes_one(api, org):
    devices = _fleet(org, ("lab", "field"))
    Device.objects.filter(pk=devices[0].pk).update(labels={"site": "lab", "old": "x"})
    body = {"filter": "hw == pi", "action": "label", "labels": {"row": "3", "old": None}}
    answer = api.post(URL, body, format="json")
    assert answer.json() == {"matched": 2, "changed": 2, "dry_run": False}, answer.content
    labels = dict(Device.objects.values_list("name", "labels"))
    assert labels["cam-0"] == {"site": "lab", "row": "3"}
    assert labels["cam-1"] == {"site": "field", "row": "3"}
    bad = api.post(URL, {"filter": "hw == pi", "action": "label", "labels": {"bad key!": "x"}}, format="json")
    assert bad.status_code == 400 and "labels" in bad.json()["error"]["fields"]
    many = {f"k{i}": "v" for i in range(63)}
    crowded = api.post(URL, {"filter": "hw == pi", "action": "label", "labels": many}, format="json")
    assert crowded.status_code == 400 and "more than 64 labels" in crowded.json()["error"]["message"]
    assert dict(Device.objects.values_list("name", "labels"))["cam-0"] == {"site": "lab", "row": "3"}


@pytest.mark.django_db
def test_revoke_needs_an_admin_and_arguments_must_fit_the_action(api, org, operator, ready_version):
    devices = _fleet(org, ("lab", "lab"))
    revoke = {"device_ids": [str(devices[0].pk)], "action": "revoke"}
    refused = _as(operator[1]).post(URL, revoke, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    assert (
        _as(operator[1]).post(URL, {"filter": "hw == pi", "action": "unpin"}, format="json").status_code
        == 200
    )
    assert api.post(URL, revoke, format="json").json()["changed"] == 1
    assert Device.objects.get(pk=devices[0].pk).revoked_at is not None
    # a filter selects live devices only: the revoked one is not matched again
    assert api.post(
        URL, {"filter": "hw == pi", "action": "revoke", "dry_run": True}, format="json"
    ).json() == {
        "matched": 1,
        "changed": 1,
        "dry_run": True,
    }

    wrong = {
        "both": {"filter": "hw == pi", "device_ids": [str(devices[1].pk)], "action": "unpin"},
        "neither": {"action": "unpin"},
        "pin without version": {"filter": "hw == pi", "action": "pin"},
        "version on unpin": {"filter": "hw == pi", "action": "unpin", "version": str(ready_version.pk)},
        "unknown action": {"filter": "hw == pi", "action": "delete"},
        "bad filter": {"filter": "site ==", "action": "unpin"},
        "unknown device": {"device_ids": ["00000000-0000-0000-0000-000000000000"], "action": "unpin"},
        "typo": {"filter": "hw == pi", "action": "unpin", "dryrun": True},
        "not a version": {
            "filter": "hw == pi",
            "action": "pin",
            "version": "00000000-0000-0000-0000-000000000000",
        },
    }
    for name, body in wrong.items():
        answer = api.post(URL, body, format="json")
        assert answer.status_code == 400, (name, answer.content)
        assert set(answer.json()["error"]) >= {"code", "message"}, name


@pytest.mark.django_db
def test_more_devices_than_the_cap_is_a_400_naming_it(api, org, monkeypatch):
    _fleet(org, ("lab", "lab", "lab"))
    monkeypatch.setattr(bulk, "MAX_DEVICES", 2)
    answer = api.post(URL, {"filter": "hw == pi", "action": "unpin", "dry_run": True}, format="json")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "too_many_devices"
    assert "at most 2" in answer.json()["error"]["message"]
