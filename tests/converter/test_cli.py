"""`ferry convert` through converter.cli.main: exit codes and what the user sees."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from converter.cli import main
from converter.samples import build_image_classifier
from engine import Session


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(build_image_classifier(), path)
    return path


def test_convert_prints_the_report(source, tmp_path, capsys):
    dst = tmp_path / "out.ferry"
    assert main(["convert", str(source), "-o", str(dst), "--quantize", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "nodes" in out and "9 -> 7" in out
    assert "fp16 accuracy" in out and "cosine" in out
    assert Session(dst).self_test().passed


def test_int4_with_calibration_and_mixed_precision(source, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps table cells to the terminal width
    samples = tmp_path / "calibration.npz"
    np.savez(samples, image=np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32))
    dst = tmp_path / "q.ferry"
    args = [
        "--quantize",
        "int4",
        "--block-size",
        "64",
        "--calibration",
        str(samples),
        "--keep-float",
        "conv1,fc",
    ]
    args += ["--activations", "minmax"]
    assert main(["convert", str(source), "-o", str(dst), *args]) == 0
    out = capsys.readouterr().out
    assert "kept float32" in out and "conv1, fc" in out
    assert "accuracy probabilities" in out and "top-1 agreement" in out and "(1 calibration input(s))" in out
    assert "size vs float32" in out and "int8 activations" in out and "1 (minmax ranges)" in out
    assert Session(dst).self_test().passed


def test_dynamic_activations_without_calibration(source, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    dst = tmp_path / "d.ferry"
    args = ["--quantize", "int8", "--activations", "dynamic"]
    assert main(["convert", str(source), "-o", str(dst), *args]) == 0
    out = capsys.readouterr().out
    assert "int8 activations" in out and "(ranges per run)" in out and "accuracy probabilities" in out
    assert Session(dst).self_test().passed


def test_output_defaults_to_the_source_name(source, capsys):
    assert main(["convert", str(source)]) == 0
    assert source.with_suffix(".ferry").exists()


def test_json_report(source, tmp_path, capsys):
    assert main(["convert", str(source), "-o", str(tmp_path / "o.ferry"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nodes_after"] == 7 and report["quantize"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quantize", "int4", "--block-size", "48"], "block_size must be one of (32, 64, 128)"),
        ([], "not an ONNX model"),
    ],
    ids=["bad-block-size", "bad-source"],
)
def test_errors_are_one_readable_line(tmp_path, source, capsys, args, message):
    src = source if args else tmp_path / "junk.onnx"
    if not args:
        src.write_bytes(b"\x00garbage\xff" * 10)
    assert main(["convert", str(src), "-o", str(tmp_path / "o.ferry"), *args]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "o.ferry").exists()


def test_usage_errors_return_2(capsys):
    assert main([]) == 2
    assert main(["convert"]) == 2
    assert "usage:" in capsys.readouterr().err
