"""CheckIn on the grpc.aio event loop (gateway.checkin_aio): the statuses its two paths end with
(answered inline from memory, computed in the pool) are the ones the synchronous check-in gave,
and every call is counted by the observability interceptor."""

from __future__ import annotations

import time

import grpc
import pytest
from fleet.models import Device
from fleet.services import device_revoke
from gateway import metrics

from tests.platform.gateway.devices import ATTRS, enrol, served


@pytest.fixture
def gateway(transactional_db):
    with served() as gateway:
        yield gateway


def _count(code: grpc.StatusCode) -> float:
    return metrics.RPCS.labels("AgentGateway/CheckIn", code.name)._value.get()


def _counted(code: grpc.StatusCode, expected: float) -> float:
    """The count once it reaches expected (or after a few seconds): an aborted call's status
    reaches the client before the server's interceptor has counted it."""
    deadline = time.monotonic() + 5.0
    while _count(code) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return _count(code)


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


def test_check_ins_from_memory_and_computed_are_counted_with_their_status(org, gateway):
    ok, denied = _count(grpc.StatusCode.OK), _count(grpc.StatusCode.PERMISSION_DENIED)
    not_offered = metrics.CHECK_INS.labels("no")._value.get()
    client, reply = enrol(gateway, org)
    client.check_in(ATTRS, "", "")  # computed (in the pool)
    assert client.check_in(ATTRS, "", "").checkin_interval_seconds > 0  # from memory (on the loop)
    device_revoke(device=Device.objects.get(pk=reply.device_id))
    # the revocation is forgotten at once in this process: computed, refused by the domain error
    assert _code(lambda: client.check_in(ATTRS, "", "")) == grpc.StatusCode.PERMISSION_DENIED
    assert _count(grpc.StatusCode.OK) == ok + 2
    assert _counted(grpc.StatusCode.PERMISSION_DENIED, denied + 1) == denied + 1
    assert metrics.CHECK_INS.labels("no")._value.get() == not_offered + 2


def test_a_check_in_without_a_certificate_is_aborted_unauthenticated(org, gateway):
    before = _count(grpc.StatusCode.UNAUTHENTICATED)
    anonymous = gateway.enrol_client()
    assert _code(lambda: anonymous.check_in(ATTRS, "", "")) == grpc.StatusCode.UNAUTHENTICATED
    assert _counted(grpc.StatusCode.UNAUTHENTICATED, before + 1) == before + 1
