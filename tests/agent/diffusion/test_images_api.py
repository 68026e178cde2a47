"""The image endpoint (agent/llm_api/images.py) on the real local API server: OpenAI's images
shape, PNG in base64 that decodes to the pipeline's image for the same seed, progress as
server-sent events, every bad request a 4xx with its reason; and the diffusion health check."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from agent.errors import ActivationError
from agent.install import health_check
from agent.llm_api.errors import ApiError
from agent.llm_api.images import ImageService, diffusion_health_check, encode_png, parse_image_request
from agent.llm_api.server import LlmApiServer
from engine.diffusion.pipeline import DiffusionPipeline, GenerationRequest
from tests.agent.diffusion.png import decode_png

PROMPT = "a red ferry on the sea"


@pytest.fixture(scope="module")
def server(package):
    service = ImageService(package.directory, name="tiny")
    api = LlmApiServer(service, port=_free_port())
    api.start()
    yield api
    api.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict | bytes) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_png_round_trips() -> None:
    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3)).astype(np.uint8)
    assert np.array_equal(decode_png(encode_png(image)), image)
    with pytest.raises(ValueError, match="uint8"):
        encode_png(image.astype(np.float32))


def test_generation_answers_in_openai_shape(server, package) -> None:
    status, raw = _post(
        f"{server.address}/v1/images/generations",
        {"prompt": PROMPT, "size": "64x48", "steps": 3, "seed": 5, "guidance_scale": 6.5, "model": "tiny"},
    )
    assert status == 200, raw
    body = json.loads(raw)
    image = decode_png(base64.b64decode(body["data"][0]["b64_json"]))
    expected = DiffusionPipeline(package.directory).generate(
        GenerationRequest(PROMPT, width=64, height=48, steps=3, guidance_scale=6.5, seed=5)
    )
    assert np.array_equal(image, expected.image)
    assert body["size"] == "64x48" and body["seed"] == 5 and body["usage"]["steps"] == 3
    assert body["usage"]["seconds_per_step"] > 0 and body["usage"]["peak_rss_bytes"] > 0
    figures = server.service.take_figures()
    assert figures["image_requests"] == 1 and figures["image_seconds_per_step"] > 0


def test_streaming_reports_every_step(server) -> None:
    status, raw = _post(
        f"{server.address}/v1/images/generations", {"prompt": PROMPT, "steps": 4, "seed": 1, "stream": True}
    )
    assert status == 200
    events = [line[len("data: ") :] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert [(e["type"], e.get("step")) for e in parsed[:-1]] == [
        ("image_generation.progress", i) for i in (1, 2, 3, 4)
    ]
    done = parsed[-1]
    assert done["type"] == "image_generation.completed" and done["size"] == "64x64"
    assert decode_png(base64.b64decode(done["b64_json"])).shape == (64, 64, 3)


@pytest.mark.parametrize(
    "body, status, reason",
    [
        ({"prompt": PROMPT, "size": "72x64"}, 400, "multiples of 16"),
        ({"prompt": PROMPT, "size": "4096x4096"}, 400, "from 32 to 96"),
        ({"prompt": PROMPT, "size": "big"}, 400, "WIDTHxHEIGHT"),
        ({"prompt": PROMPT, "n": 2}, 400, "n=1"),
        ({"prompt": PROMPT, "response_format": "url"}, 400, "b64_json"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": PROMPT, "steps": 0}, 400, "steps"),
        ({"prompt": PROMPT, "guidance_scale": "high"}, 400, "guidance_scale"),
        ({"prompt": PROMPT, "scheduler": "pndm"}, 400, "not one of"),
        ({"prompt": PROMPT, "colour": "red"}, 400, "unknown field"),
        ({"prompt": PROMPT, "model": "other"}, 404, "not served here"),
        (b"{not json", 400, "not valid JSON"),
    ],
)
def test_bad_requests_get_a_reason(server, body, status: int, reason: str) -> None:
    got, raw = _post(f"{server.address}/v1/images/generations", body)
    assert got == status
    assert reason in json.loads(raw)["error"]["message"]


def test_chat_on_an_image_model_points_at_the_image_endpoint(server) -> None:
    got, raw = _post(
        f"{server.address}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    )
    assert got == 400 and "/v1/images/generations" in json.loads(raw)["error"]["message"]


def test_no_active_diffusion_package_is_503() -> None:
    api = LlmApiServer(None, port=_free_port())
    api.start()
    try:
        got, raw = _post(f"{api.address}/v1/images/generations", {"prompt": PROMPT})
        assert got == 503 and "no diffusion package" in json.loads(raw)["error"]["message"]
    finally:
        api.stop()


def test_parse_refuses_bad_types() -> None:
    with pytest.raises(ApiError, match="stream"):
        parse_image_request(json.dumps({"prompt": PROMPT, "stream": "yes"}).encode())
    assert parse_image_request(json.dumps({"prompt": PROMPT, "size": "32x96"}).encode()).height == 96


def test_health_check_regenerates_the_recorded_image(package, tmp_path: Path) -> None:
    diffusion_health_check(package.directory)
    health_check(package.directory)  # the agent's activation path finds the diffusion kind
    broken = Path(shutil.copytree(package.directory, tmp_path / "broken"))
    recorded = np.load(broken / "selftest.npy")
    np.save(broken / "selftest.npy", (255 - recorded).astype(np.uint8))
    with pytest.raises(ActivationError, match="PSNR"):
        health_check(broken)
