"""The agent's record of the LoRA adapters installed beside its base (adapters.json) and the fit
check an adapter package passes before it is activated: bound to the active base's weights, else
refused as incompatible in the words the control plane's release check uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.adapters import AdapterBook, InstalledAdapter, adapter_name, check_fits, llm_base_digest
from agent.errors import IncompatibleModel
from deploy.compat import adapter_mismatch
from deploy.package.manifest import file_entry


def _package(directory: Path, files: dict[str, bytes], metadata: dict) -> Path:
    """An unpacked package: its files and a manifest listing them."""
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    manifest = {"files": [file_entry(n, d) for n, d in files.items()], "metadata": metadata}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def _base(directory: Path, weights: bytes) -> Path:
    return _package(directory, {"llm.json": b"{}", "weights.bin": weights}, {"kind": "llm"})


def _adapter(directory: Path, bound_to: str, name: str = "") -> Path:
    metadata = {
        "kind": "llm-adapter",
        "adapter": {"base_digest": bound_to},
        **({"name": name} if name else {}),
    }
    return _package(directory, {"adapter.json": b"{}", "adapter.bin": b"\0" * 8}, metadata)


def test_an_adapter_fits_only_the_base_it_is_bound_to(tmp_path: Path) -> None:
    base, other = _base(tmp_path / "base", b"w" * 64), _base(tmp_path / "other", b"x" * 64)
    digest = llm_base_digest(base)
    assert len(digest) == 64 and digest != llm_base_digest(other)
    adapter = _adapter(tmp_path / "pirate", digest, name="pirate")
    assert check_fits(adapter, base) == digest and adapter_name(adapter, "fallback") == "pirate"
    with pytest.raises(IncompatibleModel) as refused:
        check_fits(adapter, other)
    assert str(refused.value) == f"incompatible: {adapter_mismatch(digest, llm_base_digest(other))}"
    assert f"bound to base weights {digest[:12]}" in str(refused.value)
    with pytest.raises(IncompatibleModel, match="the device runs no LLM"):
        check_fits(adapter, None)
    onnx = _package(tmp_path / "onnx", {"graph.json": b"{}"}, {})
    with pytest.raises(IncompatibleModel, match="the device runs no LLM"):
        check_fits(adapter, onnx)
    assert adapter_name(_adapter(tmp_path / "unnamed", digest), "v-7") == "v-7"


def test_the_book_keeps_one_version_per_name_and_forgets_other_bases(tmp_path: Path) -> None:
    book = AdapterBook(tmp_path)
    assert book.install(InstalledAdapter("pirate", "v1", "a" * 64)) is None
    assert book.install(InstalledAdapter("poet", "v2", "a" * 64)) is None
    replaced = book.install(InstalledAdapter("pirate", "v3", "a" * 64))
    assert replaced is not None and replaced.version_id == "v1"
    assert book.install(InstalledAdapter("sailor", "v4", "b" * 64)) is None
    assert book.version_ids() == {"v1", "v2", "v3", "v4"}  # v1 stays until v3 settles
    assert sorted(book.for_base("a" * 64)) == ["pirate", "poet"] and book.for_base("") == {}
    assert AdapterBook(tmp_path).by_version("v3").name == "pirate"  # it is on disk, not in memory
    gone = book.remove_version("v2")
    assert gone is not None and gone.name == "poet" and book.remove_version("v2") is None
    assert book.forget_other_bases("a" * 64) == ["sailor"]
    assert sorted(json.loads((tmp_path / "adapters.json").read_text())) == ["pirate"]


def test_a_newer_version_keeps_what_it_replaced_until_it_settles(tmp_path: Path) -> None:
    book = AdapterBook(tmp_path)
    book.install(InstalledAdapter("pirate", "v1", "a" * 64))
    book.install(InstalledAdapter("pirate", "v2", "a" * 64))
    assert book.replaced_by("v2") == InstalledAdapter("pirate", "v1", "a" * 64)
    assert book.version_ids() == {"v1", "v2"}  # v1's files stay while v2 is on probation
    assert book.all() == {"pirate": InstalledAdapter("pirate", "v2", "a" * 64)}

    # v2 fails in probation: the name goes back to v1 when v1 can still run, else away
    assert book.roll_back("v2", lambda before: True) == InstalledAdapter("pirate", "v1", "a" * 64)
    assert book.all() == {"pirate": InstalledAdapter("pirate", "v1", "a" * 64)} and book.version_ids() == {
        "v1"
    }
    book.install(InstalledAdapter("pirate", "v3", "a" * 64))
    assert book.roll_back("v3", lambda before: False) is None and book.all() == {}

    book.install(InstalledAdapter("poet", "v4", "a" * 64))
    book.install(InstalledAdapter("poet", "v5", "a" * 64))
    book.settle()  # v5 passed probation: v4 is forgotten and its files may go
    assert book.replaced_by("v5") is None and book.version_ids() == {"v5"}
    assert book.roll_back("v5", lambda before: True) is None and book.all() == {}
