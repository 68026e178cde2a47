"""The no-change check-in: answered from the gateway's memory with no query at all, and
recomputed as soon as anything it depends on changes."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from django.db.backends import utils
from fleet.models import Device
from fleet.services import device_pin
from releases.services import release_create

from tests.platform.gateway.test_gateway import ATTRS, _enrolled, gateway  # noqa: F401
from tests.platform.releases.test_rollout_api import second_version  # noqa: F401


@pytest.fixture
def queries(monkeypatch) -> dict[str, list[str]]:
    """SQL run per thread name, every connection's (the gateway answers on its own threads)."""
    seen: dict[str, list[str]] = defaultdict(list)
    execute = utils.CursorWrapper._execute

    def counted(self, sql, params, *ignored):
        seen[threading.current_thread().name].append(sql)
        return execute(self, sql, params, *ignored)

    monkeypatch.setattr(utils.CursorWrapper, "_execute", counted)
    return seen


def _gateway_sql(queries: dict[str, list[str]]) -> list[str]:
    """The SQL of the gateway's worker threads (not the test's, nor the refresher's batch writes)."""
    others = (threading.main_thread().name, "checkin-refresher")
    return [sql for thread, run in queries.items() if thread not in others for sql in run]


def test_a_no_change_check_in_runs_no_query_and_changes_still_arrive(
    org,
    admin,
    ready_version,
    second_version,  # noqa: F811
    gateway,  # noqa: F811
    queries,
):
    client, reply = _enrolled(org, gateway)
    release_create(
        organisation=org,
        version=ready_version,
        name="v1",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
    )
    first = client.check_in(ATTRS, "", "").desired
    assert first.version_id == str(ready_version.pk)
    queries.clear()
    for _ in range(5):
        again = client.check_in(ATTRS, "", "").desired
        assert again.assignment == first.assignment  # the same signed bytes
    # answered from memory: not even the device row its certificate names is read
    assert _gateway_sql(queries) == []

    # a release started elsewhere bumps the fleet generation: the next check-in recomputes
    release_create(
        organisation=org,
        version=second_version,
        name="v2",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
    )
    v2 = client.check_in(ATTRS, "", "").desired
    assert v2.version_id == str(second_version.pk) and v2.assignment != first.assignment

    # a pin is a fleet change too
    device_pin(device=Device.objects.get(pk=reply.device_id), version_id=ready_version.pk)
    pinned = client.check_in(ATTRS, "", "").desired
    assert (pinned.version_id, pinned.release_id) == (str(ready_version.pk), "")

    # the device's own attributes are part of the cache key: a device that changes them is re-decided
    queries.clear()
    client.check_in(ATTRS.__class__(hardware="other", os="linux", agent_version="test"), "", "")
    assert len(_gateway_sql(queries)) > 1
