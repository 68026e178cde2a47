"""What the gateway's answers from memory (gateway/checkin_fast.py) owe the rest of the system:
the held-assignment token, hinted check-ins, batched last_seen_at and revocations heard from
another process, with the real gateway on loopback, PostgreSQL and Redis."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import grpc
import pytest
import redis
from django.utils import timezone
from ferry_cloud.release_key import release_public_key
from fleet.models import Device
from gateway import checkin_fast
from gateway.desired_cache import GENERATION_KEY
from gateway.revocations import STREAM
from releases.services import release_create

from deploy.trust.assignment import verify_assignment
from tests.platform.gateway.test_checkin_fast_path import _gateway_sql, queries  # noqa: F401
from tests.platform.gateway.test_gateway import ATTRS, _enrolled, gateway  # noqa: F401


def _counter(reply, device_id: str, organisation_id: str) -> int:
    offer = reply.desired
    return verify_assignment(
        offer.assignment,
        offer.assignment_signature,
        [release_public_key()],
        device_id=device_id,
        organisation_id=organisation_id,
        last_counter=0,
        now=time.time(),
    ).counter


def test_a_device_holding_its_assignment_is_told_unchanged_from_memory(
    org,
    admin,
    ready_version,
    gateway,  # noqa: F811
    queries,  # noqa: F811
):
    client, reply = _enrolled(org, gateway)
    release_create(
        organisation=org,
        version=ready_version,
        name="r",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
    )
    first = client.check_in(ATTRS, "", "")
    counter = _counter(first, reply.device_id, reply.organisation_id)
    queries.clear()
    held = client.check_in(ATTRS, "", "", held_assignment_counter=counter)
    assert held.desired_unchanged and not held.HasField("desired")
    older = client.check_in(ATTRS, "", "", held_assignment_counter=counter - 1)  # not what it should hold
    assert not older.desired_unchanged and older.desired.assignment == first.desired.assignment
    assert _gateway_sql(queries) == []  # both answered from memory


def test_a_hinted_check_in_reads_the_fleet_generation_afresh(org, gateway, queries):  # noqa: F811
    client, reply = _enrolled(org, gateway)
    client.check_in(ATTRS, "", "")
    queries.clear()
    client.check_in(ATTRS, "", "")
    assert _gateway_sql(queries) == []
    # another process bumps the generation and hints: this process's view may lag a tick behind
    redis.Redis.from_url(os.environ["REDIS_URL"]).incr(GENERATION_KEY.format(org.pk))
    client.check_in(ATTRS, "", "", hinted=True)
    assert _gateway_sql(queries), "the hinted check-in was answered from a stale view"


def test_check_ins_answered_from_memory_move_last_seen_at_in_batches(org, gateway, monkeypatch):  # noqa: F811
    monkeypatch.setattr(checkin_fast, "_RESOLUTION", 0.0)  # note every check-in, not once a minute
    client, reply = _enrolled(org, gateway)
    client.check_in(ATTRS, "", "")  # computed: it writes last_seen_at itself
    long_ago = timezone.now() - timedelta(minutes=10)
    Device.objects.filter(pk=reply.device_id).update(last_seen_at=long_ago)
    client.check_in(ATTRS, "", "")  # from memory: noted for the batch
    checkin_fast.refresher.last_seen.flush()  # what the refresher does every second
    seen = Device.objects.get(pk=reply.device_id).last_seen_at
    assert seen > long_ago + timedelta(minutes=9)

    later = timezone.now() + timedelta(hours=1)  # a later time written meanwhile is kept
    Device.objects.filter(pk=reply.device_id).update(last_seen_at=later)
    client.check_in(ATTRS, "", "")
    checkin_fast.refresher.last_seen.flush()
    assert Device.objects.get(pk=reply.device_id).last_seen_at == later


def test_a_revocation_heard_only_through_redis_is_refused_within_a_second(org, gateway):  # noqa: F811
    client, reply = _enrolled(org, gateway)
    client.check_in(ATTRS, "", "")
    client.check_in(ATTRS, "", "")  # from memory
    # as another process revokes: the row, then its announcement on the stream (no local event)
    Device.objects.filter(pk=reply.device_id).update(revoked_at=timezone.now())
    redis.Redis.from_url(os.environ["REDIS_URL"]).xadd(STREAM, {"device": reply.device_id})
    revoked_at = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        while time.monotonic() - revoked_at < 5:
            client.check_in(ATTRS, "", "")
            time.sleep(0.05)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert time.monotonic() - revoked_at < checkin_fast.STALE_SECONDS + 0.5
