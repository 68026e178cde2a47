"""A bulk device action is one typed event of the organisation's audit feed: who, what, how many,
by which filter or ids; a dry run is none. (Its webhook delivery: tests/platform/test_webhooks.py.)"""

from __future__ import annotations

import pytest
from fleet.models import BulkAction, Device
from fleet.services import device_enrol, enrolment_token_create

URL = "/api/v1/devices/bulk/"


def _fleet(org, sites=("lab", "lab", "field")) -> list[Device]:
    devices = []
    for i, site in enumerate(sites):
        token = enrolment_token_create(organisation=org, labels={"site": site}).token
        devices.append(device_enrol(token=token, name=f"cam-{i}", attributes={}, labels={}).device)
    return devices


def _feed(api, **query) -> list[dict]:
    answer = api.get("/api/v1/audit/", query)
    assert answer.status_code == 200, answer.content
    return answer.json()["results"]


@pytest.mark.django_db
def test_each_bulk_action_is_one_typed_event_in_the_feed(api, org, ready_version):
    devices = _fleet(org)
    pin = {"filter": "labels.site == lab", "action": "pin", "version": str(ready_version.pk)}
    assert api.post(URL, {**pin, "dry_run": True}, format="json").status_code == 200
    assert _feed(api, type="devices.bulk_pin") == []  # a dry run changes and audits nothing

    assert api.post(URL, pin, format="json").json()["changed"] == 2
    [event] = _feed(api, type="devices.bulk_pin")
    assert (event["type"], event["action"], event["actor"]) == ("devices.bulk_pin", "bulk_pin", "alice")
    assert (event["release"], event["release_name"]) == (None, None)
    details = event["details"]
    assert details["filter"] == "labels.site == lab" and details["device_ids"] == []
    assert (details["matched"], details["changed"], details["version"]) == (2, 2, str(ready_version.pk))
    assert details["bulk_action"] == BulkAction.objects.get().pk
    assert "2 of 2 device(s) matching labels.site == lab" in event["reason"]

    ids = [str(devices[0].pk), str(devices[2].pk)]
    assert api.post(URL, {"device_ids": ids, "action": "unpin"}, format="json").json()["changed"] == 1
    newest = _feed(api)[0]  # newest first, beside the releases' events
    assert newest["type"] == "devices.bulk_unpin"
    assert (newest["details"]["device_ids"], newest["details"]["device_ids_given"]) == (ids, 2)
    assert (newest["details"]["matched"], newest["details"]["changed"]) == (2, 1)
    both = _feed(api, actor="alice", type=["devices.bulk_pin", "devices.bulk_unpin"])
    assert [e["type"] for e in both] == ["devices.bulk_unpin", "devices.bulk_pin"]


@pytest.mark.django_db
def test_a_refused_bulk_action_leaves_no_event(api, org):
    _fleet(org)
    refused = api.post(URL, {"filter": "labels.site == lab", "action": "pin"}, format="json")
    assert refused.status_code == 400
    assert _feed(api) == [] and not BulkAction.objects.exists()


@pytest.mark.django_db
def test_another_organisations_bulk_events_are_not_in_the_feed(api, org, outsider):
    from rest_framework.test import APIClient

    _fleet(org)
    unpin = {"filter": "labels.site == lab", "action": "unpin"}
    assert api.post(URL, unpin, format="json").status_code == 200
    assert [e["type"] for e in _feed(api)] == ["devices.bulk_unpin"]
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {outsider[1]}")
    assert _feed(other) == []
