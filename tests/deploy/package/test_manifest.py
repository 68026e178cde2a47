"""The manifest: canonical bytes, files listed in order, and the format version the engine reads."""

from __future__ import annotations

import json
from pathlib import Path

import engine.format
from deploy.package import manifest
from tests.deploy.package.helpers import FILES, INPUTS, OUTPUTS


def test_the_writer_stamps_the_newest_version_the_engine_reads():
    assert manifest.FORMAT_VERSION == engine.format.FORMAT_VERSION
    assert manifest.FORMAT_VERSION in engine.format.READABLE_VERSIONS
    assert (manifest.FORMAT, manifest.MANIFEST) == (engine.format.FORMAT, engine.format.MANIFEST)


def test_listing_names_every_file_in_order_with_its_sha256_and_size():
    listed = manifest.Manifest.listing(FILES, inputs=INPUTS, outputs=OUTPUTS)
    assert [entry["path"] for entry in listed.files] == ["graph.json", "weights.bin"]
    assert listed.files[1]["size"] == len(FILES[1][1])
    assert listed.files[1]["sha256"] == manifest.file_entry("weights.bin", FILES[1][1])["sha256"]
    assert listed.metadata == {} and listed.format_version == manifest.FORMAT_VERSION


def test_manifest_bytes_are_canonical_json():
    first = manifest.Manifest.listing(FILES, inputs=INPUTS, outputs=OUTPUTS, metadata={"b": 1, "a": 2})
    again = manifest.Manifest.listing(FILES, inputs=INPUTS, outputs=OUTPUTS, metadata={"a": 2, "b": 1})
    data = first.to_bytes()
    assert data == again.to_bytes()
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()


def test_an_unpacked_manifest_is_read_back(tmp_path: Path):
    written = manifest.Manifest.listing(FILES, inputs=INPUTS, outputs=OUTPUTS)
    (tmp_path / manifest.MANIFEST).write_bytes(written.to_bytes())
    assert manifest.read_unpacked(tmp_path) == written.as_dict()
    assert manifest.listed_files(written.as_dict())["graph.json"]["size"] == len(FILES[0][1])
