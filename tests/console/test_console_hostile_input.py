"""Whatever a URL or a form carries, the device pages answer with a page, never a crash, and
show it as text."""

from __future__ import annotations

import base64
import json

import pytest
from django.test import Client
from fleet.models import Device
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.console.test_console_device_pages import fleet

HOSTILE = st.text(max_size=60) | st.sampled_from(
    ["<script>alert(1)</script>", "none", "active", "5m", "' or 1=1 --", "hardware ==", "\x00"]
)
CURSORS = HOSTILE | st.builds(
    lambda name, pk: base64.urlsafe_b64encode(json.dumps([name, pk]).encode()).decode(),
    st.text(max_size=20),
    st.text(max_size=40) | st.uuids().map(str),
)


@pytest.fixture
def admin_client(db, org, admin, ready_version) -> Client:
    fleet(org, 30, version=ready_version)
    client = Client()
    client.force_login(admin[0])
    return client


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filter_text=HOSTILE, after=CURSORS, version=HOSTILE, group=HOSTILE, state=HOSTILE, seen=HOSTILE)
def test_the_device_list_answers_any_query(admin_client, filter_text, after, version, group, state, seen):
    params = {"filter": filter_text, "after": after, "version": version, "group": group, "state": state}
    response = admin_client.get("/devices/", {**params, "seen": seen})
    assert response.status_code == 200
    assert "<script>alert(1)</script>" not in response.content.decode()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=HOSTILE | st.sampled_from(["pin", "unpin", "add-to-group"]), ids=st.lists(HOSTILE, max_size=4))
def test_a_bulk_action_with_junk_changes_nothing(admin_client, action, ids):
    before = list(Device.objects.order_by("pk").values_list("pk", "pinned_version_id", "revoked_at"))
    response = admin_client.post("/devices/bulk/", {"action": action, "device": ids, "confirmed": "yes"})
    assert response.status_code == 302
    assert list(Device.objects.order_by("pk").values_list("pk", "pinned_version_id", "revoked_at")) == before


@pytest.mark.parametrize("name", ["\x00", "a\x00b", "é\x00"])
def test_a_cursor_holding_a_nul_starts_over(admin_client, name):
    cursor = base64.urlsafe_b64encode(json.dumps([name, "00000000-0000-0000-0000-000000000000"]).encode())
    response = admin_client.get("/devices/", {"after": cursor.decode()})
    assert response.status_code == 200 and "dev-00000" in response.content.decode()
    refused = admin_client.get("/devices/", {"version": "\x00", "group": "\x00"}).content.decode()
    assert 'id="filter-problem"' in refused and "No device group" in refused


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=HOSTILE, page=HOSTILE)
def test_the_models_list_answers_any_search(admin_client, query, page):
    response = admin_client.get("/models/", {"q": query, "page": page})
    assert response.status_code == 200
    assert "<script>alert(1)</script>" not in response.content.decode()
