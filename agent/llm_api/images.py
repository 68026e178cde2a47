"""The device's image endpoint: ``POST /v1/images/generations`` in the shape of OpenAI's images API,
over an active diffusion package (engine/diffusion), on the same local server as the chat API.

Request: ``prompt`` (required), ``size`` ("WxH", default the package's), ``n`` (1 only),
``steps``, ``seed``, ``guidance_scale``, ``negative_prompt``, ``scheduler``, ``model``,
``response_format`` ("b64_json" only: the device keeps no files to link to), ``stream``.
Answer: ``{"created", "data": [{"b64_json": <PNG>, "revised_prompt"}], "usage"}``; with
``stream: true``, server-sent events: one ``image_generation.progress`` per denoising step, then
``image_generation.completed`` carrying the image, then ``[DONE]``.  Bad requests get a 4xx in
OpenAI's error shape with the reason.  The PNG is written here with zlib and struct (Pillow is
not a device dependency).  ``ImageService`` stands where the chat API's service stands, so the
agent's host, its metrics and its 503-when-inactive work unchanged; ``diffusion_health_check``
is the activation's check for diffusion packages.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ActivationError
from agent.llm_api.errors import ApiError, ClientGone, invalid, json_object
from agent.llm_api.service import gate_figures

IMAGES_PATH = "/v1/images/generations"
DEFAULT_QUEUE_BOUND = 4
MAX_PROMPT_CHARS = 4000
FIELDS = {
    "prompt", "negative_prompt", "size", "n", "steps", "seed", "guidance_scale", "scheduler",
    "model", "response_format", "stream", "user", "quality", "style",
}  # fmt: skip


# -- the request -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRequest:
    prompt: str
    negative_prompt: str = ""
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    seed: int | None = None
    guidance_scale: float | None = None
    scheduler: str | None = None
    model: str = ""
    stream: bool = False


def parse_image_request(body: bytes) -> ImageRequest:
    """The request in ``body`` (JSON), or ApiError 400 naming the field at fault."""
    data = json_object(body)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise invalid(f"unknown field(s) {unknown[:5]}")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise invalid(f"'prompt' must be a non-empty string of at most {MAX_PROMPT_CHARS} characters")
    if data.get("n", 1) != 1 or isinstance(data.get("n"), bool):
        raise invalid("only n=1 is supported")
    if data.get("response_format", "b64_json") != "b64_json":
        raise invalid("only response_format 'b64_json' is supported (the device serves no image URLs)")
    width, height = _size(data.get("size"))
    return ImageRequest(
        prompt=prompt,
        negative_prompt=_string(data, "negative_prompt"),
        width=width,
        height=height,
        steps=_integer(data.get("steps"), "steps", 1, 1000),
        seed=_integer(data.get("seed"), "seed", 0, 2**63 - 1),
        guidance_scale=_number(data.get("guidance_scale"), "guidance_scale"),
        scheduler=_string(data, "scheduler") or None,
        model=_string(data, "model"),
        stream=_flag(data.get("stream")),
    )


def _size(value: Any) -> tuple[int | None, int | None]:
    if value is None or value == "auto":
        return None, None
    parts = value.split("x") if isinstance(value, str) else []
    if len(parts) != 2 or not all(p.isdigit() and 0 < len(p) <= 5 for p in parts):
        raise invalid(f"'size' must be 'WIDTHxHEIGHT' such as '512x512', got {str(value)[:40]!r}")
    return int(parts[0]), int(parts[1])


def _string(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        raise invalid(f"'{name}' must be a string of at most {MAX_PROMPT_CHARS} characters")
    return value


def _integer(value: Any, name: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"'{name}' must be an integer from {low} to {high}, got {value!r}"[:200])
    return value


def _number(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"'{name}' must be a number, got {value!r}"[:200])
    return float(value)


def _flag(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid("'stream' must be true or false")
    return value


# -- PNG without Pillow ------------------------------------------------------------------------


def encode_png(image: Any) -> bytes:
    """An 8-bit RGB PNG of a uint8 [height, width, 3] array (filter 0 rows, one zlib stream)."""
    height, width, channels = image.shape
    if channels != 3 or str(image.dtype) != "uint8":
        raise ValueError(f"encode_png wants uint8 [height, width, 3], got {image.dtype} {image.shape}")
    rows = image.reshape(height, width * 3)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


# -- the service -------------------------------------------------------------------------------


@dataclass
class Figures:
    images: int = 0
    errors: int = 0
    steps: int = 0
    step_seconds: float = 0.0
    total_seconds: list[float] = field(default_factory=list)
    peak_rss_bytes: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            # the release gates' fields: an image is an inference, its latency the whole generation
            **gate_figures(self.images, self.errors, self.total_seconds),
            "image_requests": self.images,
            "image_errors": self.errors,
            "image_seconds_per_step": round(self.step_seconds / self.steps, 4) if self.steps else None,
            "image_total_seconds_max": round(max(self.total_seconds), 3) if self.total_seconds else None,
            "image_peak_rss_bytes": self.peak_rss_bytes or None,
        }


class ImageService:
    """An unpacked diffusion package behind the API: one generation at a time, ``queue_bound``
    waiting (429 past that).  Answers chat requests with a 400 pointing at the image endpoint."""

    def __init__(
        self, directory: Path, name: str = "", version_id: str = "", queue_bound: int = DEFAULT_QUEUE_BOUND
    ) -> None:
        from engine.diffusion.pipeline import DiffusionPipeline  # noqa: PLC0415 - numpy only when used

        self.directory = Path(directory)
        self.pipeline = DiffusionPipeline(self.directory)
        self.name = name or self.directory.name
        self.version_id = version_id
        self._admitted = threading.BoundedSemaphore(queue_bound + 1)
        self._running = threading.Lock()
        self._figures_lock = threading.Lock()
        self._figures = Figures()

    def models(self) -> dict[str, Any]:
        created = int(self.directory.stat().st_mtime)
        return {
            "object": "list",
            "data": [{"id": self.name, "object": "model", "created": created, "owned_by": "ferry"}],
        }

    def complete(self, request: Any, on_text: Any = None) -> Any:
        raise invalid(f"this device serves an image model; POST {IMAGES_PATH}", "wrong_endpoint")

    def generate(
        self, request: ImageRequest, on_step: Callable[[int, int, float], None] | None = None
    ) -> dict[str, Any]:
        """The response body for ``request`` (ApiError 4xx for what the package cannot do)."""
        from engine.diffusion.errors import GenerationRequestError  # noqa: PLC0415
        from engine.diffusion.pipeline import GenerationRequest  # noqa: PLC0415

        if request.model and request.model != self.name:
            raise ApiError(
                404, f"model {request.model!r} is not served here; try {self.name!r}", code="model_not_found"
            )
        seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(6), "big")
        wanted = GenerationRequest(
            request.prompt,
            request.negative_prompt,
            request.width,
            request.height,
            request.steps,
            request.guidance_scale,
            seed,
            request.scheduler,
        )
        try:
            wanted = self.pipeline.resolve(wanted)
        except GenerationRequestError as exc:
            raise invalid(str(exc)) from exc
        if not self._admitted.acquire(blocking=False):
            raise ApiError(
                429,
                "the model is busy and its queue is full; retry shortly",
                "rate_limit_error",
                "queue_full",
            )
        try:
            with self._running:
                result = self._run(wanted, on_step)
        finally:
            self._admitted.release()
        return {
            "created": int(time.time()),
            "data": [
                {
                    "b64_json": base64.b64encode(encode_png(result.image)).decode(),
                    "revised_prompt": request.prompt,
                }
            ],
            "size": f"{wanted.width}x{wanted.height}",
            "seed": seed,
            "usage": result.figures(),
        }

    def _run(self, request: Any, on_step: Callable[[int, int, float], None] | None) -> Any:
        try:
            result = self.pipeline.generate(request, on_step)
        except ClientGone:
            raise
        except Exception:
            self.count_error()
            raise
        with self._figures_lock:
            f = self._figures
            f.images += 1
            f.steps += len(result.step_seconds)
            f.step_seconds += sum(result.step_seconds)
            f.total_seconds.append(result.total_seconds)
            f.peak_rss_bytes = max(f.peak_rss_bytes, result.peak_rss_bytes)
        return result

    def count_error(self) -> None:
        with self._figures_lock:
            self._figures.errors += 1

    def take_figures(self) -> dict[str, Any]:
        with self._figures_lock:
            figures, self._figures = self._figures, Figures()
        return figures.summary()


def make_service(directory: Path, name: str = "", version_id: str = "") -> Any:
    """The API's service for an unpacked package: images for a diffusion package, else chat."""
    from engine.diffusion.package import is_diffusion_package  # noqa: PLC0415

    if is_diffusion_package(directory):
        return ImageService(directory, name=name, version_id=version_id)
    from agent.llm_api.service import LlmService  # noqa: PLC0415

    return LlmService(directory, name=name, version_id=version_id)


def is_served_package(directory: Path) -> bool:
    """Whether the local API serves this package (an LLM or a diffusion model)."""
    from agent.llm_api.service import is_llm_package  # noqa: PLC0415
    from engine.diffusion.package import is_diffusion_package  # noqa: PLC0415

    return is_llm_package(directory) or is_diffusion_package(directory)


# -- the HTTP door (called from server.py's handler) ------------------------------------------


def handle_images(handler: Any, service: Any) -> None:
    """Answer one POST /v1/images/generations on ``handler`` (the server's request handler)."""
    request = parse_image_request(handler._body())
    if not isinstance(service, ImageService):
        raise ApiError(503, "no diffusion package is active on this device", "server_error", "no_model")
    if not request.stream:
        handler._json(200, service.generate(request))
        return
    handler.close_connection = True
    started = False

    def event(body: dict[str, Any]) -> None:
        nonlocal started
        if not started:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Cache-Control", "no-cache")
            handler.send_header("Connection", "close")
            handler.end_headers()
            started = True
        try:
            handler._event(json.dumps(body))
        except OSError as exc:
            raise ClientGone() from exc

    def on_step(step: int, steps: int, seconds: float) -> None:
        event(
            {"type": "image_generation.progress", "step": step, "steps": steps, "seconds": round(seconds, 4)}
        )

    try:
        body = service.generate(request, on_step)
    except ApiError as exc:
        if not started:
            raise
        event(exc.body())
        handler._event("[DONE]")
        return
    event(
        {
            "type": "image_generation.completed",
            **body["data"][0],
            **{k: v for k, v in body.items() if k != "data"},
        }
    )
    handler._event("[DONE]")


# -- the activation's health check -------------------------------------------------------------


def diffusion_health_check(directory: Path) -> None:
    """Regenerate the 2-step image recorded at conversion (fixed seed) and compare: below the
    package's PSNR floor the version does not go live."""
    import numpy as np  # noqa: PLC0415

    from engine.diffusion.package import SELFTEST_IMAGE  # noqa: PLC0415
    from engine.diffusion.pipeline import DiffusionPipeline, GenerationRequest  # noqa: PLC0415
    from engine.diffusion.quality import psnr  # noqa: PLC0415

    pipeline = DiffusionPipeline(directory, threads=1)
    test = pipeline.spec.selftest
    try:
        expected = np.load(Path(directory) / SELFTEST_IMAGE, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ActivationError(f"the diffusion package's self-test image is unreadable ({exc})") from exc
    request = GenerationRequest(
        test.prompt,
        width=test.size,
        height=test.size,
        steps=test.steps,
        guidance_scale=test.guidance_scale,
        seed=test.seed,
        scheduler=test.scheduler,
    )
    image = pipeline.generate(request).image
    if image.shape != expected.shape:
        raise ActivationError(
            f"the diffusion self-test made a {image.shape} image, conversion recorded {expected.shape}"
        )
    score = psnr(image, expected)
    if score < test.min_psnr:
        raise ActivationError(
            f"the diffusion self-test image differs from the one recorded at conversion "
            f"(PSNR {score:.1f} dB, needs {test.min_psnr:.0f})"
        )


__all__ = [
    "IMAGES_PATH",
    "ImageRequest",
    "ImageService",
    "diffusion_health_check",
    "encode_png",
    "handle_images",
    "is_served_package",
    "make_service",
    "parse_image_request",
]
