"""The running agent's side of the chat API: when the active version is an LLM package, load it
and serve it on 127.0.0.1:``port`` (0: loaded for the health of the device, not served); the
figures it gathers go into the agent's metrics records.  ``kv_cache`` ("fp32"/"int8"; None:
the package's or ``FERRY_LLM_KV_CACHE``) is the KV cache an LLM package is served with."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agent.llm_api.images import is_served_package, make_service

log = logging.getLogger(__name__)


class LlmHost:
    def __init__(self, port: int = 0, host: str = "127.0.0.1", kv_cache: str | None = None) -> None:
        self.port = port
        self.host = host
        self.kv_cache = kv_cache
        self.service: Any = None  # an LlmService or an ImageService (images.py)
        self._server = None

    @property
    def version(self) -> str:
        return self.service.version_id if self.service is not None else ""

    def load(self, directory: Path, version_id: str) -> bool:
        """Serve ``directory`` if it is an LLM or diffusion package (True), else stop serving (False)."""
        if not version_id or not is_served_package(directory):
            self._unload()
            return False
        # the resolved path: ``current`` is switched by a rename while this version runs
        service = make_service(Path(directory).resolve(), name=_model_name(directory), version_id=version_id)
        if self.kv_cache and hasattr(service, "use_kv_cache"):  # an LLM, not a diffusion package
            service.use_kv_cache(self.kv_cache)
        service = self.adapt(service)  # a subclass serves more beside it (agent/adapters.py)
        self.service = service
        if self.port:
            if self._server is None:
                from agent.llm_api.server import LlmApiServer  # noqa: PLC0415

                self._server = LlmApiServer(service, host=self.host, port=self.port)
                self._server.start()
                log.info("LLM chat API on %s/v1", self._server.address)
            self._server.service = service
        return True

    def adapt(self, service: Any) -> Any:
        """The service to serve for a newly loaded package (agent.adapters adds LoRA adapters)."""
        return service

    def _unload(self) -> None:
        self.service = None
        if self._server is not None:
            self._server.service = None  # 503 until an LLM package is active again

    def take_figures(self) -> dict[str, Any]:
        return self.service.take_figures() if self.service is not None else {}

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def _model_name(directory: Path) -> str:
    import json  # noqa: PLC0415

    try:
        manifest = json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8"))
        name = (manifest.get("metadata") or {}).get("name")
    except (OSError, ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) and name else Path(directory).resolve().name
