"""Enrolment tokens: one device each, and only until they expire; a refusal says which and why."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from fleet.models import Device, EnrolmentToken
from fleet.services import EnrolmentRefused, device_enrol, enrolment_token_create


def _enrol(token: str, name: str = "cam"):
    return device_enrol(token=token, name=name, attributes={}, labels={})


def test_the_default_lifetime_is_the_setting(org, api):
    with override_settings(FERRY_ENROLMENT_TOKEN_HOURS=2):
        record = enrolment_token_create(organisation=org).record
        made = api.post("/api/v1/enrolment-tokens/", {"labels": {"site": "lab"}})
    assert timedelta(hours=1, minutes=59) < record.expires_at - timezone.now() <= timedelta(hours=2)
    assert made.status_code == 201, made.content
    from_rest = EnrolmentToken.objects.get(pk=made.json()["id"])
    assert timedelta(hours=1, minutes=59) < from_rest.expires_at - timezone.now() <= timedelta(hours=2)
    asked = api.post("/api/v1/enrolment-tokens/", {"ttl_hours": 5}).json()
    assert EnrolmentToken.objects.get(pk=asked["id"]).expires_at > timezone.now() + timedelta(hours=4)


def test_a_token_enrols_one_device_and_is_then_refused(org, api):
    issued = enrolment_token_create(organisation=org)
    first = _enrol(issued.token).device
    with pytest.raises(EnrolmentRefused, match="already been used; ask for a new one"):
        _enrol(issued.token, name="second")
    assert list(Device.objects.filter(organisation=org)) == [first]
    listed = api.get("/api/v1/enrolment-tokens/").json()["results"]
    assert [row["state"] for row in listed if row["id"] == issued.record.pk] == ["used"]


def test_an_expired_token_is_refused_and_enrols_nothing(org, api):
    issued = enrolment_token_create(organisation=org, ttl=timedelta(hours=1))
    EnrolmentToken.objects.filter(pk=issued.record.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with pytest.raises(EnrolmentRefused, match="has expired; ask for a new one"):
        _enrol(issued.token)
    assert not Device.objects.exists()
    assert EnrolmentToken.objects.get(pk=issued.record.pk).used_at is None
    listed = api.get("/api/v1/enrolment-tokens/").json()["results"]
    assert [row["state"] for row in listed if row["id"] == issued.record.pk] == ["expired"]


def test_a_revoked_token_is_refused_as_expired(org, api):
    issued = enrolment_token_create(organisation=org)
    assert api.post(f"/api/v1/enrolment-tokens/{issued.record.pk}/revoke/").status_code == 200
    with pytest.raises(EnrolmentRefused, match="expired"):
        _enrol(issued.token)
    assert not Device.objects.exists()


@pytest.mark.parametrize("token", ["", "fet_", "fet_" + "A" * 32, "x" * 10_000])
def test_an_unknown_token_is_refused(org, token):
    enrolment_token_create(organisation=org)
    with pytest.raises(EnrolmentRefused, match="Unknown enrolment token"):
        _enrol(token)
    assert not Device.objects.exists()


@pytest.mark.parametrize("hours", [0, -1, 24 * 30 + 1, "soon"])
def test_a_bad_lifetime_is_refused_and_makes_nothing(api, hours):
    refused = api.post("/api/v1/enrolment-tokens/", {"ttl_hours": hours})
    assert refused.status_code == 400
    assert "ttl_hours" in refused.json()["error"]["fields"]
    assert not EnrolmentToken.objects.exists()
