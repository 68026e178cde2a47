"""Hostile safetensors files and package indexes: a clear CheckpointError, never a crash."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.llm.errors import CheckpointError
from engine.llm.safetensors import SafetensorsFile

ENTRY = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "F16", "BF16", "I8", "F64", 3]),
        "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), st.just("x")),
        "data_offsets": st.one_of(st.lists(st.integers(-4, 200), min_size=0, max_size=3), st.none()),
    }
)


@settings(max_examples=150, deadline=None)
@given(
    entries=st.dictionaries(st.text(min_size=1, max_size=8), ENTRY, max_size=3), data=st.binary(max_size=160)
)
def test_any_header_reads_consistently_or_is_refused(entries: dict, data: bytes) -> None:
    header = json.dumps(entries).encode()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + data)
        try:
            mapped = SafetensorsFile(path)
        except CheckpointError as exc:
            assert "x.safetensors" in str(exc)
            return
        for name in mapped.names():  # everything accepted is readable with its listed shape
            tensor = mapped.tensor(name)
            assert tensor.shape == tuple(entries[name]["shape"])
            assert np.all(np.isfinite(tensor) | np.isnan(tensor) | np.isinf(tensor))


@settings(max_examples=60, deadline=None)
@given(blob=st.binary(max_size=64))
def test_arbitrary_bytes_are_refused_or_read(blob: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "y.safetensors"
        path.write_bytes(blob)
        try:
            mapped = SafetensorsFile(path)
        except CheckpointError as exc:
            assert "y.safetensors" in str(exc)
            return
        assert len(blob) >= 8 and all(mapped.tensor(n) is not None for n in mapped.names())
