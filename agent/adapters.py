"""LoRA adapters released through the fleet: installed beside their base LLM, served together.

An adapter version arrives like any version (a signed assignment, a small package, verified and
unpacked into versions/<id>), but it never replaces the active base: ``current`` keeps pointing
at the base LLM, and the adapter joins the set this module keeps in ``adapters.json``
(name -> version, base digest, package digest).  Every adapter of the active base is loaded
into the one LlmService (one mapped base, several low-rank adds) and chosen per request by
its model name; the name is the package's signed ``metadata.name`` (the control plane stamps
the registry model's name), so a newer version of the same adapter replaces the older one
and different adapters sit side by side.

An adapter is bound to its base's weights (engine.llm.lora.base_digest); one whose base is not
the active one is refused before it is activated (deploy.compat.adapter_mismatch words it as
the control plane's release check does), and adapters left behind by a base upgrade are no
longer served.  Each adapter's requests, tokens and errors are counted here, by name, and
reported in a metrics record of the adapter's own version (agent/daemon.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ActivationError, IncompatibleModel
from agent.files import read_json, write_json_atomic
from agent.llm_api.host import LlmHost
from agent.llm_api.service import gate_figures

log = logging.getLogger(__name__)

ADAPTER_KIND = "llm-adapter"  # engine.llm.lora.ADAPTER_KIND (not imported: it pulls numpy in)
BOOK = "adapters.json"


def _manifest(directory: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _metadata(directory: Path) -> dict[str, Any]:
    metadata = _manifest(directory).get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def is_adapter_package(directory: Path) -> bool:
    """Whether an unpacked package is a LoRA adapter (``metadata.kind: "llm-adapter"``)."""
    return _metadata(directory).get("kind") == ADAPTER_KIND


def adapter_base(directory: Path) -> str:
    """The base weights' digest an unpacked adapter package is bound to ("" if it names none)."""
    header = _metadata(directory).get("adapter")
    digest = header.get("base_digest") if isinstance(header, dict) else None
    return digest if isinstance(digest, str) else ""


def adapter_name(directory: Path, fallback: str) -> str:
    """The model name a request uses for this adapter: its signed ``metadata.name``, else ``fallback``."""
    name = _metadata(directory).get("name")
    return name if isinstance(name, str) and name else fallback


def llm_base_digest(directory: Path | None) -> str:
    """The base-weights digest of an unpacked LLM package ("" when it is not one, or missing)."""
    if directory is None or _metadata(directory).get("kind") != "llm":
        return ""
    from engine.llm.errors import LlmError  # noqa: PLC0415 - numpy only when an LLM is involved
    from engine.llm.lora import base_digest  # noqa: PLC0415

    try:
        return base_digest(_manifest(directory))
    except LlmError:
        return ""


def check_fits(adapter_directory: Path, base_directory: Path | None) -> str:
    """The adapter's base digest if it fits the active base; else IncompatibleModel naming both."""
    from deploy.compat import adapter_mismatch  # noqa: PLC0415

    wanted = adapter_base(adapter_directory)
    found = adapter_mismatch(wanted, llm_base_digest(base_directory))
    if found is not None:
        raise IncompatibleModel(f"incompatible: {found}")
    return wanted


def try_load(adapter_directory: Path, base_directory: Path) -> None:
    """Load the adapter against the base's config (the activation's health check): a malformed
    adapter fails here, not in the served API."""
    from engine.llm.lora import load_adapter  # noqa: PLC0415
    from engine.llm.package import load_model  # noqa: PLC0415

    model = load_model(base_directory)
    load_adapter(adapter_directory, model.config, expected_base=llm_base_digest(base_directory))


def can_serve_again(adapter: InstalledAdapter, versions_dir: Path, base_directory: Path | None) -> bool:
    """An adapter replaced during probation can serve again: files kept, bound to the active base."""
    return (versions_dir / adapter.version_id).is_dir() and adapter.base_digest == llm_base_digest(
        base_directory
    )


@dataclass(frozen=True)
class InstalledAdapter:
    name: str
    version_id: str
    base_digest: str
    package_digest: str = ""


def install(
    book: AdapterBook, directory: Path, base_directory: Path | None, version_id: str, package_digest: str
) -> InstalledAdapter:
    """Check the unpacked adapter against the active base, load it, and record it in ``book``
    (replacing an older version of the same name); IncompatibleModel or ActivationError say why not."""
    digest = check_fits(directory, base_directory)
    try:
        try_load(directory, base_directory)
    except Exception as exc:  # a malformed adapter is its own failure, not the agent's
        raise ActivationError(f"the adapter does not load: {type(exc).__name__}: {exc}") from exc
    adapter = InstalledAdapter(adapter_name(directory, version_id), version_id, digest, package_digest)
    replaced = book.install(adapter)
    if replaced is not None and replaced.version_id != version_id:
        log.info("adapter %s: %s replaces %s", adapter.name, version_id, replaced.version_id)
    log.info("adapter %s (%s) installed beside the active base", adapter.name, version_id)
    return adapter


class AdapterBook:
    """``adapters.json``: the adapters installed beside a base, by name (atomic writes).

    A newer version of a name keeps the one it replaced (``replaces``) until its probation ends
    (``settle``), so a version that fails there gives the name back to the one before it."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / BOOK

    def _entries(self) -> dict[str, dict[str, Any]]:
        return read_json(self.path, {}) or {}

    @staticmethod
    def _adapter(entry: dict[str, Any]) -> InstalledAdapter:
        return InstalledAdapter(**{k: v for k, v in entry.items() if k != "replaces"})

    def all(self) -> dict[str, InstalledAdapter]:
        return {name: self._adapter(entry) for name, entry in self._entries().items()}

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        write_json_atomic(self.path, dict(sorted(entries.items())))

    def install(self, adapter: InstalledAdapter) -> InstalledAdapter | None:
        """Add the adapter (replacing an older version of the same name, which is returned)."""
        entries = self._entries()
        old = entries.get(adapter.name)
        replaced = self._adapter(old) if old else None
        entry: dict[str, Any] = asdict(adapter)
        if replaced is not None and replaced.version_id != adapter.version_id:
            entry["replaces"] = asdict(replaced)
        elif old and old.get("replaces"):  # the same version again keeps what it replaced
            entry["replaces"] = old["replaces"]
        entries[adapter.name] = entry
        self._write(entries)
        return replaced

    def remove_version(self, version_id: str) -> InstalledAdapter | None:
        entries = self._entries()
        name = next((n for n, e in entries.items() if e.get("version_id") == version_id), None)
        if name is None:
            return None
        gone = self._adapter(entries.pop(name))
        self._write(entries)
        return gone

    def replaced_by(self, version_id: str) -> InstalledAdapter | None:
        """The adapter that ``version_id`` replaced and still keeps (until it settles)."""
        entry = next((e for e in self._entries().values() if e.get("version_id") == version_id), None)
        return self._adapter(entry["replaces"]) if entry and entry.get("replaces") else None

    def roll_back(
        self, version_id: str, restorable: Callable[[InstalledAdapter], bool]
    ) -> InstalledAdapter | None:
        """Remove the failed ``version_id``; give its name back to the adapter it replaced when
        ``restorable`` says that one can still run (its files kept, bound to the active base).
        Returns the restored adapter, or None."""
        before = self.replaced_by(version_id)
        if self.remove_version(version_id) is None or before is None or not restorable(before):
            return None
        entries = self._entries()
        entries[before.name] = asdict(before)
        self._write(entries)
        return before

    def settle(self) -> None:
        """The newer versions passed probation: forget what they replaced (its files may go)."""
        entries = self._entries()
        if any("replaces" in e for e in entries.values()):
            self._write({n: {k: v for k, v in e.items() if k != "replaces"} for n, e in entries.items()})

    def by_version(self, version_id: str) -> InstalledAdapter | None:
        return next((a for a in self.all().values() if a.version_id == version_id), None)

    def for_base(self, digest: str) -> dict[str, InstalledAdapter]:
        return {name: a for name, a in self.all().items() if digest and a.base_digest == digest}

    def forget_other_bases(self, digest: str) -> list[str]:
        """Drop adapters bound to another base (after a base upgrade settles); their names."""
        entries = self._entries()
        kept = {name: e for name, e in entries.items() if e.get("base_digest") == digest}
        if len(kept) != len(entries):
            self._write(kept)
        return sorted(set(entries) - set(kept))

    def version_ids(self) -> set[str]:
        """Every version whose files must stay: installed ones and those they may give back to."""
        ids = set()
        for entry in self._entries().values():
            ids.add(entry["version_id"])
            if entry.get("replaces"):
                ids.add(entry["replaces"]["version_id"])
        return ids


@dataclass
class AdapterFigures:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    tokens_generated: int = 0
    ttft: list[float] = field(default_factory=list)  # seconds, one per served request

    def summary(self) -> dict[str, Any]:
        return {
            # what the release gates read: the adapter's own release is gated on its own traffic
            **gate_figures(self.requests, self.errors, self.ttft),
            "llm_requests": self.requests,
            "llm_errors": self.errors,
            "llm_prompt_tokens": self.prompt_tokens,
            "llm_tokens_generated": self.tokens_generated,
        }


class AdapterMeter:
    """The served LlmService, counting each adapter's requests, tokens and errors by name (the
    service's own figures count every request it serves, adapters included)."""

    def __init__(self, service: Any, adapters: dict[str, InstalledAdapter]) -> None:
        self._service = service
        self.installed = dict(adapters)
        self._lock = threading.Lock()
        self._figures = {name: AdapterFigures() for name in adapters}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    def complete(self, request: Any, on_text: Callable[[str], None] | None = None) -> Any:
        if request.model not in self._figures:
            return self._service.complete(request, on_text=on_text)
        from agent.llm_api.errors import ApiError, ClientGone  # noqa: PLC0415

        try:
            completion = self._service.complete(request, on_text=on_text)
        except ClientGone:
            raise  # the client left: not the adapter's failure
        except ApiError as exc:
            if exc.status >= 500:
                self._count(request.model, errors=1)
            raise
        except Exception:
            self._count(request.model, errors=1)
            raise
        self._count(
            request.model,
            requests=1,
            prompt_tokens=completion.prompt_tokens,
            tokens_generated=completion.completion_tokens,
        )
        if completion.time_to_first_token is not None:
            with self._lock:
                self._figures[request.model].ttft.append(completion.time_to_first_token)
        return completion

    def _count(self, name: str, **amounts: int) -> None:
        with self._lock:
            figures = self._figures[name]
            for counter, amount in amounts.items():
                setattr(figures, counter, getattr(figures, counter) + amount)

    def take_adapter_figures(self) -> list[tuple[InstalledAdapter, dict[str, Any]]]:
        """Each served adapter and its figures since the last call."""
        with self._lock:
            taken, self._figures = self._figures, {name: AdapterFigures() for name in self._figures}
        return [(self.installed[name], figures.summary()) for name, figures in sorted(taken.items())]


class AdapterHost(LlmHost):
    """The agent's LLM host, serving the adapters installed beside the active base as well."""

    def __init__(
        self, book: AdapterBook, port: int = 0, host: str = "127.0.0.1", kv_cache: str | None = None
    ) -> None:
        super().__init__(port, host, kv_cache)
        self.book = book

    def adapt(self, service: Any) -> Any:
        from agent.llm_api.service import LlmService  # noqa: PLC0415

        if not isinstance(service, LlmService):
            return service
        digest = llm_base_digest(service.directory)
        loaded = {}
        for name, adapter in sorted(self.book.for_base(digest).items()):
            directory = self.book.state_dir / "versions" / adapter.version_id
            try:
                service.add_adapter(name, directory)
            except Exception as exc:  # noqa: BLE001 - one broken adapter must not take the base down
                log.error("adapter %s (%s) not served: %s", name, adapter.version_id, exc)
                continue
            loaded[name] = adapter
        if loaded:
            log.info("serving adapters %s beside %s", ", ".join(loaded), service.version_id)
        return AdapterMeter(service, loaded)

    def served_adapters(self) -> dict[str, InstalledAdapter]:
        """The adapters served now, by model name."""
        return dict(self.service.installed) if isinstance(self.service, AdapterMeter) else {}

    def take_adapter_figures(self) -> list[tuple[InstalledAdapter, dict[str, Any]]]:
        service = self.service
        return service.take_adapter_figures() if isinstance(service, AdapterMeter) else []
