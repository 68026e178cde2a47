"""The chat service in process: the queue's bound (429), the template sandbox, the figures the
agent reports (and the telemetry schema accepts), and the LLM health check."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from agent.errors import ActivationError
from agent.install import health_check
from agent.llm_api.chat_request import ChatRequest
from agent.llm_api.errors import ApiError
from agent.llm_api.service import LlmService
from agent.llm_api.template import ChatTemplate, TemplateError
from converter.llm.convert import convert_llm
from deploy.package.signing import generate_keypair
from deploy.package.verify import verify_and_unpack
from deploy.package.writer import sign_package
from tests.engine.llm.checkpoints import write_checkpoint

ASK = ChatRequest(messages=[{"role": "user", "content": "The ferry"}], max_tokens=4, temperature=0)


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm")
    write_checkpoint(root / "ckpt", "llama", max_position_embeddings=64)
    convert_llm(root / "ckpt", root / "m.ferry", weights="int4")
    keys = generate_keypair()
    sign_package(root / "m.ferry", root / "s.ferry", keys.private_key)
    verify_and_unpack(root / "s.ferry", root / "unpacked", keys.public_key)
    return root / "unpacked"


def _hold(service: LlmService) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """A streamed request that waits inside generation until released."""
    inside, release = threading.Event(), threading.Event()

    def on_text(_: str) -> None:
        inside.set()
        release.wait(30)

    request = dataclasses.replace(ASK, max_tokens=3, temperature=1.0, seed=1)
    thread = threading.Thread(target=lambda: service.complete(request, on_text=on_text))
    thread.start()
    assert inside.wait(30)
    return thread, inside, release


def test_requests_run_one_at_a_time_and_a_full_queue_is_429(unpacked: Path) -> None:
    service = LlmService(unpacked, name="m", queue_bound=0)
    thread, _, release = _hold(service)
    try:
        with pytest.raises(ApiError) as refused:
            service.complete(ASK)
        assert refused.value.status == 429 and refused.value.body()["error"]["code"] == "queue_full"
    finally:
        release.set()
        thread.join(30)
    assert service.complete(ASK).completion_tokens >= 1  # a slot again once it finished


def test_the_figures_count_requests_and_fit_the_telemetry_schema(unpacked: Path) -> None:
    from telemetry.schema import validate_record

    service = LlmService(unpacked, name="m")
    service.complete(ASK)
    with pytest.raises(ApiError):
        service.complete(dataclasses.replace(ASK, model="other"))
    figures = service.take_figures()
    assert figures["llm_requests"] == 1 and figures["llm_tokens_generated"] >= 1
    assert figures["llm_ttft_ms_p50"] > 0 and figures["llm_prefill_tokens_per_second"] > 0
    record = validate_record(
        seq=1, kind="metrics", timestamp=1e9, version_id="v", payload_json=json.dumps(figures), now=1e9
    )
    assert record.payload["llm_requests"] == 1
    assert service.take_figures()["llm_requests"] == 0  # taken: the next record starts from zero


def test_the_template_runs_sandboxed() -> None:
    rendered = ChatTemplate("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}").render(
        [{"role": "user", "content": "hi"}]
    )
    assert rendered == "[user]hi"
    hostile = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateError):
        hostile.render([{"role": "user", "content": "hi"}])
    refusing = ChatTemplate("{{ raise_exception('system messages are not supported') }}")
    with pytest.raises(TemplateError, match="not supported"):
        refusing.render([])
    assert ChatTemplate(None).render([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


def test_the_health_check_regenerates_the_recorded_tokens(unpacked: Path, tmp_path: Path) -> None:
    health_check(unpacked)
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in unpacked.iterdir():
        (broken / f.name).symlink_to(f)
    manifest = json.loads((unpacked / "manifest.json").read_text())
    tokens = manifest["metadata"]["llm"]["selftest"]["tokens"]
    manifest["metadata"]["llm"]["selftest"]["tokens"] = [(tokens[0] + 1) % 200, *tokens[1:]]
    (broken / "manifest.json").unlink()
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ActivationError, match="LLM self-test generated"):
        health_check(broken)


def test_the_api_answers_on_a_unix_socket(unpacked: Path, tmp_path: Path) -> None:
    import http.client
    import socket

    from agent.llm_api.server import LlmApiServer

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(tmp_path / "llm.sock"))

    server = LlmApiServer(LlmService(unpacked, name="m"), unix_socket=tmp_path / "llm.sock")
    server.start()
    try:
        connection = UnixConnection("localhost")
        body = json.dumps({"model": "m", "messages": ASK.messages, "max_tokens": 3, "temperature": 0})
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and answer["choices"][0]["message"]["role"] == "assistant"
        assert server.address == f"unix:{tmp_path / 'llm.sock'}"
    finally:
        server.stop()
    assert not (tmp_path / "llm.sock").exists()
