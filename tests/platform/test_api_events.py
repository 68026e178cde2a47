"""Events out: a release's completion, abort and rollback and a device's refusal are typed rows of
the event feed, and GET /api/v1/events/stream/ serves the same rows live as server-sent events
(filters, Last-Event-ID resume, heartbeats, a bounded lifetime, a cap per process)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from fleet.services import device_enrol, enrolment_token_create
from releases.device_status import device_status_record, update_report_from
from releases.services import release_create, release_transition

from tests.platform.conftest import member_of


def _device(org, name: str = "cam"):
    token = enrolment_token_create(organisation=org).token
    return device_enrol(token=token, name=name, attributes={}, labels={"site": "lab"}).device


def _release(org, version, device, name: str, actor=None):
    return release_create(
        organisation=org,
        version=version,
        name=name,
        target={"device_ids": [str(device.pk)]},
        actor=actor,
        start=True,
    )


def _refuse(device, release, version) -> None:
    report = update_report_from(
        state="refused",
        version_id=str(version.pk),
        release_id=str(release.pk),
        assignment_counter=1,
        reason_code="device_class",
        message="signed for another device class",
        at=0,
    )
    device_status_record(device=device, report=report)


@pytest.mark.django_db
def test_completion_abort_rollback_and_refusal_are_typed_events_of_the_feed(api, org, admin, ready_version):
    device = _device(org)
    done = _release(org, ready_version, device, "done", admin[0])
    release_transition(release_id=done.pk, action="advance", actor=admin[0], reason="all good")
    stopped = _release(org, ready_version, device, "stopped", admin[0])
    _refuse(device, stopped, ready_version)
    release_transition(release_id=stopped.pk, action="abort", reason="a device refused")
    undone = _release(org, ready_version, device, "undone", admin[0])
    release_transition(release_id=undone.pk, action="rollback", actor=admin[0], reason="bad numbers")

    feed = api.get("/api/v1/audit/?ordering=at").json()["results"]
    assert [(e["release_name"], e["type"]) for e in feed] == [
        ("done", "release.created"),
        ("done", "release.started"),
        ("done", "release.completed"),
        ("stopped", "release.created"),
        ("stopped", "release.started"),
        ("stopped", "device.refused"),
        ("stopped", "release.aborted"),
        ("undone", "release.created"),
        ("undone", "release.started"),
        ("undone", "release.rolled_back"),
    ]
    refusal = next(e for e in feed if e["type"] == "device.refused")
    assert refusal["details"]["reason_code"] == "device_class" and refusal["actor"] is None

    wanted = "/api/v1/audit/?type=release.completed&type=device.refused&type=release.rolled_back"
    assert [e["type"] for e in api.get(wanted).json()["results"]] == [
        "release.rolled_back",
        "device.refused",
        "release.completed",
    ]
    advanced = api.get("/api/v1/audit/?type=release.advanced").json()["results"]
    assert advanced == []  # the advance that completed is release.completed only
    refused = api.get("/api/v1/audit/?type=release.finished")
    assert refused.status_code == 400 and "type" in refused.json()["error"]["fields"]
    one = api.get(f"/api/v1/releases/{done.pk}/events/?type=release.completed").json()["results"]
    assert [e["reason"] for e in one] == ["all good"]


class Stream:
    """An open SSE connection read frame by frame (a frame: the lines up to a blank one)."""

    def __init__(self, url: str, token: str, **headers: str) -> None:
        self._client = httpx.Client(timeout=30)
        request = self._client.build_request(
            "GET", url, headers={"Authorization": f"Token {token}", "Accept": "text/event-stream", **headers}
        )
        self.response = self._client.send(request, stream=True)
        self._lines = self.response.iter_lines()

    def frame(self) -> dict[str, str] | None:
        """The next frame as {field: value} (comments under ":"); None when the stream ended."""
        fields: dict[str, str] = {}
        for line in self._lines:
            if line == "":
                if fields:
                    return fields
                continue
            name, _, value = line.partition(":")
            fields[name or ":"] = value.removeprefix(" ")
        return fields or None

    def events(self, count: int) -> list[dict]:
        found = []
        while len(found) < count:
            frame = self.frame()
            assert frame is not None, f"the stream ended after {found}"
            if "data" in frame:
                found.append({**json.loads(frame["data"]), "_id": frame["id"], "_event": frame["event"]})
        return found

    def close(self) -> None:
        self.response.close()
        self._client.close()


@pytest.fixture
def stream_slots(monkeypatch) -> threading.BoundedSemaphore:
    """This test's own two stream slots: the live server is the session's, and a stream an
    earlier test closed gives its slot back only at its next write (a heartbeat)."""
    from ferry_cloud import event_stream

    slots = threading.BoundedSemaphore(2)
    monkeypatch.setattr(event_stream, "_slots", slots)
    return slots


@pytest.mark.slow
def test_the_stream_serves_the_feed_live_and_resumes_after_last_event_id(
    live_server, org, admin, ready_version, settings, stream_slots
):
    settings.FERRY_SSE_POLL_SECONDS = 0.1
    settings.FERRY_SSE_HEARTBEAT_SECONDS = 0.5
    settings.FERRY_SSE_MAX_SECONDS = 20
    device = _device(org)
    earlier = _release(org, ready_version, device, "before the stream", admin[0])  # not replayed
    url = f"{live_server.url}/api/v1/events/stream/"
    stream = Stream(url + "?type=release.aborted&type=device.refused&type=release.completed", admin[1])
    try:
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        assert stream.response.headers["cache-control"] == "no-cache"
        assert int(stream.response.headers["RateLimit-Remaining"]) >= 0
        assert stream.frame() == {"retry": "1000"}
        heartbeat = stream.frame()
        assert heartbeat == {":": "heartbeat"}  # nothing happened yet: the connection is kept alive

        release = _release(org, ready_version, device, "live", admin[0])  # created, started: filtered out
        _refuse(device, release, ready_version)
        release_transition(release_id=release.pk, action="abort", reason="refused")
        release_transition(release_id=earlier.pk, action="advance", reason="done")
        refusal, abort, completion = stream.events(3)
    finally:
        stream.close()
    assert (refusal["_event"], abort["_event"], completion["_event"]) == (
        "device.refused",
        "release.aborted",
        "release.completed",
    )
    assert refusal["type"] == "device.refused" and refusal["_id"] == str(refusal["id"])
    assert abort["release_name"] == "live" and abort["reason"] == "refused"
    assert completion["release_name"] == "before the stream"

    # the same rows as the feed, byte for byte
    feed = httpx.get(
        f"{live_server.url}/api/v1/audit/?release={release.pk}&type=release.aborted",
        headers={"Authorization": f"Token {admin[1]}"},
    ).json()["results"]
    assert feed == [{k: v for k, v in abort.items() if not k.startswith("_")}]

    # a reconnect names the last event it saw and gets only what came after it
    resumed = Stream(url + "?type=release.aborted&type=device.refused&type=release.completed", admin[1],
                     **{"Last-Event-ID": refusal["_id"]})  # fmt: skip
    try:
        assert [e["id"] for e in resumed.events(2)] == [abort["id"], completion["id"]]
    finally:
        resumed.close()
    # clients that went away give their slots back (noticed at the next heartbeat's write)
    assert all(stream_slots.acquire(timeout=10) for _ in range(2)), "a closed stream kept its slot"


@pytest.mark.slow
def test_a_stream_ends_after_its_lifetime_and_is_scoped_to_the_organisation(
    live_server, org, admin, ready_version, outsider, settings, stream_slots
):
    settings.FERRY_SSE_POLL_SECONDS = 0.1
    settings.FERRY_SSE_MAX_SECONDS = 1.5
    _release(org, ready_version, _device(org), "acme-only", admin[0])
    theirs = Stream(f"{live_server.url}/api/v1/events/stream/?after=2000-01-01T00:00:00Z", outsider[1])
    ours = Stream(f"{live_server.url}/api/v1/events/stream/?after=2000-01-01T00:00:00Z", admin[1])
    try:
        frames = []
        while (frame := theirs.frame()) is not None:  # ends by itself: the lifetime
            frames.append(frame)
        assert frames[0] == {"retry": "1000"} and not any("data" in f for f in frames)
        assert "reconnect with Last-Event-ID" in frames[-1][":"]
        assert [e["type"] for e in ours.events(2)] == ["release.created", "release.started"]  # replayed
    finally:
        theirs.close()
        ours.close()


@pytest.mark.slow
def test_refusals_answer_json_even_to_an_event_stream_client(live_server, org, settings, monkeypatch):
    url = f"{live_server.url}/api/v1/events/stream/"
    anonymous = httpx.get(url, headers={"Accept": "text/event-stream"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "not_authenticated"
    token = member_of(org, "vera", "viewer")[1]
    bad = httpx.get(
        url + "?type=nope", headers={"Authorization": f"Token {token}", "Accept": "text/event-stream"}
    )
    assert bad.status_code == 400 and "type" in bad.json()["error"]["fields"]

    head = httpx.head(url, headers={"Authorization": f"Token {token}"})  # answered at once, no stream
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")

    from ferry_cloud import event_stream

    settings.FERRY_SSE_MAX_SECONDS = 5
    monkeypatch.setattr(event_stream, "_slots", threading.BoundedSemaphore(1))
    first = Stream(url, token)
    try:
        assert first.response.status_code == 200
        second = httpx.get(url, headers={"Authorization": f"Token {token}"})
        assert second.status_code == 503 and second.json()["error"]["code"] == "too_many_streams"
        assert int(second.headers["Retry-After"]) > 0
    finally:
        first.close()
