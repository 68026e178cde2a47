"""``ferry-agent serve-llm``: the local chat API on any converted package, without a control plane.

A directory is served as it is (the user unpacked it).  An archive (.ferry) is unpacked into a
temporary directory: with ``--public-key`` through deploy.package's verify-then-unpack (a
signature by another key, or none, is refused); without one, its files are checked against
the manifest's sizes and sha256 (integrity, not authenticity: said once in the log), so a
converter's unsigned output can be tried on a laptop.
"""

from __future__ import annotations

import json
import logging
import tarfile
import tempfile
from pathlib import Path

from agent.llm_api.service import package_kind

log = logging.getLogger(__name__)


class PackageError(Exception):
    """The package cannot be served (names the file and why)."""


def read_public_key(path: Path) -> bytes:
    """A raw 32-byte Ed25519 public key, or its 64-character hex."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PackageError(f"{path}: cannot read the public key ({exc.strerror or exc})") from exc
    if len(data) == 32:
        return data
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != 32:
        raise PackageError(f"{path}: not an Ed25519 public key (32 raw bytes or 64 hex characters)")
    return key


def open_package(source: Path, workdir: Path, public_key: bytes | None = None, kind: str = "llm") -> Path:
    """The unpacked directory of ``source`` (a directory, or an archive unpacked under ``workdir``),
    which must be a package of ``kind`` ("llm", or "llm-adapter" for a LoRA adapter)."""
    source = Path(source)
    if source.is_dir():
        directory = source
    elif source.is_file():
        directory = workdir / ("package" if kind == "llm" else f"{kind}-{source.name}")
        if public_key is not None:
            directory = _verified(source, directory, public_key)
        else:
            directory = _checked(source, directory)
    else:
        raise PackageError(f"{source}: no such package file or directory")
    if package_kind(directory) != kind:
        raise PackageError(f"{source}: its manifest's metadata.kind is not {kind!r}")
    return directory


def _verified(archive: Path, dest: Path, public_key: bytes) -> Path:
    from deploy.errors import PackageRejected  # noqa: PLC0415
    from deploy.package import verify_and_unpack  # noqa: PLC0415

    try:
        verify_and_unpack(archive, dest, public_key)
    except PackageRejected as exc:
        raise PackageError(f"{archive}: refused: {exc}") from exc
    log.info("%s: signature verified", archive)
    return dest


def _checked(archive: Path, dest: Path) -> Path:
    from deploy.package import file_sha256  # noqa: PLC0415

    log.warning(
        "%s: no --public-key given; files are checked against the manifest, the signature is not", archive
    )
    dest.mkdir(parents=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(dest, filter="data")  # refuses links, absolute and .. paths
        manifest = json.loads((dest / "manifest.json").read_text(encoding="utf-8"))
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise PackageError(f"{archive}: not a readable package archive ({exc})") from exc
    for entry in manifest.get("files", []) if isinstance(manifest, dict) else []:
        path = dest / str(entry.get("path", ""))
        if (
            not path.is_file()
            or path.stat().st_size != entry.get("size")
            or file_sha256(path) != entry.get("sha256")
        ):
            raise PackageError(f"{archive}: {entry.get('path')!r} does not match the manifest")
    return dest


def serve(
    source: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    unix_socket: Path | None = None,
    public_key: bytes | None = None,
    name: str = "",
    queue_bound: int = 8,
    adapters: dict[str, Path] | None = None,
    kv_cache: str | None = None,
    threads: int | None = None,
) -> None:
    """Load the package (and its LoRA ``adapters``, by model name) and serve it until
    interrupted (SIGINT or SIGTERM).  An adapter made for another base is refused.
    ``kv_cache``: "int8" or "fp32" (None: the package's choice, see agent/llm_api/service.py);
    ``threads``: the cores a request's kernels may use (None: ``FERRY_LLM_THREADS``, else 1)."""
    from agent.llm_api.server import LlmApiServer  # noqa: PLC0415
    from agent.llm_api.service import LlmService  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="ferry-serve-llm-") as workdir:
        directory = open_package(Path(source), Path(workdir), public_key)
        default_name = Path(source).name.removesuffix(".ferry")
        found = {
            adapter_name: open_package(Path(path), Path(workdir), public_key, kind="llm-adapter")
            for adapter_name, path in (adapters or {}).items()
        }
        try:
            service = LlmService(
                directory,
                name=name or default_name,
                queue_bound=queue_bound,
                adapters=found,
                kv_cache=kv_cache,
                threads=threads,
            )
        except ValueError as exc:
            raise PackageError(str(exc)) from exc
        server = LlmApiServer(service, host=host, port=port, unix_socket=unix_socket)
        # one line a script can wait for
        print(f"serving {service.name!r} on {server.address}", flush=True)
        log.info("KV cache %s, kept across requests (a shared prefix is prefilled once)", service.kv_cache)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
