"""ferryctl's HTTP client in-process against the live server: retried creates, uploads, pages."""

from __future__ import annotations

import io

import httpx
import pytest
from registry.models import Model

from ferryctl.client import ApiError, Ferry, ReadProgress
from ferryctl.config import Config
from tests.platform.conftest import onnx_bytes


class LosesFirstAnswer(httpx.HTTPTransport):
    """The request reaches the server, but the first answer never comes back (a timeout)."""

    def __init__(self):
        super().__init__()
        self.keys: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.keys.append(request.headers.get("Idempotency-Key", ""))
        if len(self.keys) == 1:
            response.read()
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return response


@pytest.fixture
def client(live_server, admin):
    def make(**kwargs) -> Ferry:
        return Ferry(Config(url=live_server.url, token=admin[1]), **kwargs)

    return make


@pytest.mark.slow
def test_a_create_retried_after_a_timeout_is_made_once(client, org):
    transport = LosesFirstAnswer()
    model = client(transport=transport).create("/models/", {"name": "once"})
    assert model["name"] == "once"
    assert len(transport.keys) == 2 and transport.keys[0] == transport.keys[1] != ""
    assert Model.objects.filter(organisation=org, name="once").count() == 1


@pytest.mark.slow
def test_an_upload_reports_every_byte_it_sends(client):
    ferry = client()
    model = ferry.create("/models/", {"name": "progress"})
    data = onnx_bytes()
    sent: list[int] = []
    reader = ReadProgress(io.BytesIO(data), sent.append)
    version = ferry.create(
        f"/models/{model['id']}/versions/", files={"file": ("m.onnx", reader)}, data={"label": "v1"}
    )
    assert version["status"] == "converting" and version["label"] == "v1"
    assert sum(sent) == len(data)


@pytest.mark.slow
def test_lists_follow_next_links_and_stop_at_the_limit(client):
    ferry = client()
    for n in range(7):
        ferry.create("/models/", {"name": f"m{n}"})
    every = [m["name"] for m in ferry.pages("/models/", {"ordering": "name", "limit": 2})]
    assert every == [f"m{n}" for n in range(7)]  # four pages of two
    assert [m["name"] for m in ferry.pages("/models/", {"ordering": "name"}, limit=3)] == ["m0", "m1", "m2"]


@pytest.mark.slow
def test_refusals_carry_the_servers_code_message_and_fields(client):
    with pytest.raises(ApiError) as refused:
        client().create("/models/", {"name": "no spaces allowed"})
    assert refused.value.status == 400 and refused.value.exit_code == 2
    assert "name" in refused.value.fields
    assert "name:" in refused.value.describe()
    with pytest.raises(ApiError) as missing:
        client().get("/releases/00000000-0000-0000-0000-000000000000/")
    assert missing.value.status == 404 and missing.value.code


class Recording(httpx.HTTPTransport):
    """The real transport, remembering each answer's status."""

    def __init__(self):
        super().__init__()
        self.statuses: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.statuses.append(response.status_code)
        return response


@pytest.mark.slow
def test_a_429_is_waited_out_and_sent_again(client, settings):
    settings.FERRY_API_RATE = "1/5s"  # three calls in a row cannot all fit one window each
    transport = Recording()
    ferry = client(transport=transport)
    try:
        answers = [ferry.get("/models/") for _ in range(3)]
    finally:
        ferry.close()
    assert all(a["results"] == [] for a in answers)
    assert 429 in transport.statuses and transport.statuses.count(200) == 3


def test_event_stream_frames_parse_as_the_sse_format_says():
    from ferryctl.stream import Frame, frames

    lines = [
        "retry: 1000",
        "",
        ": heartbeat",
        "",
        "id: 7",
        "event: release.aborted",
        "data: {",
        "data: }",
        "",
    ]
    parsed = list(frames(iter(lines)))
    assert parsed == [
        Frame(id=None, event=None, data=None, retry=1000),
        Frame(id=None, event=None, data=None),
        Frame(id="7", event="release.aborted", data="{\n}"),
    ]
