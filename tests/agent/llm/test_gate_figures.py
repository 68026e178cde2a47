"""The chat API's figures in the fields the release gates read (deploy/gates.py): a served request
is an inference, a request that fails on the device's side (5xx) an error, a client's mistake
(4xx) neither, and the latency figures are the requests' time to first token.  Served over real
HTTP from a real package whose chat template breaks on multi-turn chats: its health check passes
(it generates from recorded tokens, not through the template), its second-turn requests fail."""

from __future__ import annotations

import dataclasses
import json
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.adapters import AdapterFigures, AdapterMeter, InstalledAdapter
from agent.llm_api.chat_request import ChatRequest
from agent.llm_api.errors import ApiError
from agent.llm_api.health import llm_health_check
from agent.llm_api.images import Figures as ImageFigures
from agent.llm_api.server import LlmApiServer
from agent.llm_api.service import LlmService
from converter.llm.convert import convert_llm
from converter.llm.lora import convert_lora
from deploy.package.signing import generate_keypair
from deploy.package.verify import verify_and_unpack
from deploy.package.writer import sign_package
from tests.engine.llm.checkpoints import write_checkpoint, write_peft

# a template that renders one-turn chats and raises on longer ones (as a real template that
# refuses a role order does): the package passes its health check and fails in service
MULTI_TURN_BREAKS = (
    "{% if messages | length > 1 %}{{ raise_exception('this template renders one turn only') }}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)
ONE_TURN = [{"role": "user", "content": "The ferry"}]
TWO_TURNS = [*ONE_TURN, {"role": "assistant", "content": "sails"}, {"role": "user", "content": "where?"}]


def break_multi_turn(checkpoint: Path) -> None:
    """Give a checkpoint directory the chat template that fails on multi-turn chats."""
    config_path = checkpoint / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": MULTI_TURN_BREAKS}))


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm-gates")
    config, _ = write_checkpoint(root / "ckpt", "llama", max_position_embeddings=64)
    break_multi_turn(root / "ckpt")
    convert_llm(root / "ckpt", root / "m.ferry", weights="int4")
    write_peft(root / "pirate", config, seed=1, alpha=16.0)  # an adapter of this base, for the meter
    convert_lora(root / "pirate", root / "m.ferry", root / "pirate.ferry")
    with tarfile.open(root / "pirate.ferry") as tar:
        tar.extractall(root / "pirate-unpacked", filter="data")
    keys = generate_keypair()
    sign_package(root / "m.ferry", root / "s.ferry", keys.private_key)
    verify_and_unpack(root / "s.ferry", root / "unpacked", keys.public_key)
    return root / "unpacked"


def post(address: str, body: dict) -> int:
    request = urllib.request.Request(
        f"{address}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def chat(messages: list[dict], **extra: object) -> dict:
    return {"model": "m", "messages": messages, "max_tokens": 3, "temperature": 0, **extra}


def test_served_requests_are_inferences_and_server_failures_are_errors(unpacked: Path) -> None:
    llm_health_check(unpacked)  # the broken template does not stop the package from activating
    server = LlmApiServer(LlmService(unpacked, name="m"), port=0)
    server.start()
    try:
        statuses = [post(server.address, chat(ONE_TURN)) for _ in range(3)]
        statuses += [
            post(server.address, chat(TWO_TURNS)),
            post(server.address, chat(TWO_TURNS, stream=True)),
        ]
        statuses.append(post(server.address, chat(ONE_TURN, model="nobody")))  # the client's mistake
        figures = server.service.take_figures()
    finally:
        server.stop()
    assert statuses[:3] == [200, 200, 200] and statuses[3] == 500 and statuses[5] == 404
    assert figures["inferences"] == figures["llm_requests"] == 3
    assert figures["errors"] == figures["llm_errors"] == 2  # the 404 is not the release's failure
    assert 0 < figures["latency_ms_p50"] <= figures["latency_ms_p95"]
    # the same time to first token; each field is rounded to its own number of decimals
    assert figures["latency_ms_p50"] == pytest.approx(figures["llm_ttft_ms_p50"], rel=1e-3, abs=1e-3)
    assert sum(figures["latency_ms_histogram"].values()) == 3


def test_the_figures_reset_when_taken_and_fit_the_telemetry_schema(unpacked: Path) -> None:
    from telemetry.schema import validate_record

    service = LlmService(unpacked, name="m")
    figures = service.take_figures()
    assert figures["inferences"] == 0 and figures["errors"] == 0 and figures["latency_ms_p95"] is None
    server = LlmApiServer(service, port=0)
    server.start()
    try:
        assert post(server.address, chat(TWO_TURNS)) == 500
    finally:
        server.stop()
    figures = {**service.take_figures(), "version": "v"}
    record = validate_record(
        seq=1, kind="metrics", timestamp=1e9, version_id="v", payload_json=json.dumps(figures), now=1e9
    )
    assert record.payload["errors"] == 1 and record.payload["inferences"] == 0
    assert service.take_figures()["errors"] == 0


def test_an_adapter_release_reads_its_own_requests_errors_and_latency(unpacked: Path) -> None:
    service = LlmService(unpacked, name="m")
    service.add_adapter("pirate", unpacked.parent / "pirate-unpacked")
    installed = InstalledAdapter(name="pirate", version_id="v-pirate", base_digest="")
    meter = AdapterMeter(service, {"pirate": installed})
    ask = ChatRequest(messages=ONE_TURN, model="pirate", max_tokens=3, temperature=0)
    assert meter.complete(ask).completion_tokens >= 1
    with pytest.raises(ApiError) as failed:
        meter.complete(dataclasses.replace(ask, messages=TWO_TURNS))
    assert failed.value.status == 500
    meter.complete(dataclasses.replace(ask, model="m"))  # the base's request: not the adapter's
    [(adapter, figures)] = meter.take_adapter_figures()
    assert adapter.version_id == "v-pirate" and figures["inferences"] == 1 and figures["errors"] == 1
    assert figures["latency_ms_p95"] > 0 and sum(figures["latency_ms_histogram"].values()) == 1
    base = service.take_figures()  # the service counts every request it served, adapters included
    assert base["inferences"] == 2 and base["errors"] == 1


def test_adapter_and_image_figures_carry_the_gate_fields() -> None:
    adapter = AdapterFigures(requests=2, errors=1, ttft=[0.010, 0.030]).summary()
    assert adapter["inferences"] == 2 and adapter["errors"] == 1
    assert adapter["latency_ms_p50"] == pytest.approx(20.0) and adapter["latency_ms_p95"] == pytest.approx(
        29.0
    )
    image = ImageFigures(images=1, errors=2, total_seconds=[1.5]).summary()
    assert (
        image["inferences"] == 1 and image["errors"] == 2 and image["latency_ms_p95"] == pytest.approx(1500.0)
    )
