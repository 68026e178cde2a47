"""Conversion options: loosely typed fields in, one checked frozen object out, errors that name
the option; convert() runs the same with it as with the separate arguments."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from converter import convert
from converter.options import OPTION_NAMES, ConversionOptions, InvalidOptionsError
from converter.samples import build_image_classifier


def test_from_dict_types_loose_fields_once():
    options = ConversionOptions.from_dict(
        {"quantize": "int4", "block_size": "64", "keep_float": " fc1, conv1 ,", "accuracy_budget": "0.99"}
    )
    assert options == ConversionOptions(
        quantize="int4", block_size=64, keep_float=("fc1", "conv1"), accuracy_budget=0.99
    )
    assert options.mixed_precision
    assert (
        ConversionOptions.from_dict({"quantize": "int8", "keep_float": "first_last"}).keep_float
        == "first_last"
    )


def test_a_wider_dict_is_narrowed_with_option_names():
    stored = {"quantize": "int8", "device_class": "pi4"}
    with pytest.raises(InvalidOptionsError, match="unknown conversion option"):
        ConversionOptions.from_dict(stored)
    narrowed = {k: v for k, v in stored.items() if k in OPTION_NAMES}
    assert ConversionOptions.from_dict(narrowed) == ConversionOptions(quantize="int8")


def test_absent_none_and_empty_fields_mean_not_set():
    assert ConversionOptions.from_dict({}) == ConversionOptions()
    blank = {
        "quantize": None,
        "keep_float": "",
        "accuracy_budget": None,
        "activations": "",
        "calibration": None,
    }
    assert ConversionOptions.from_dict(blank) == ConversionOptions()
    assert not ConversionOptions().mixed_precision


def test_options_are_frozen_and_a_list_of_names_is_kept_as_a_tuple():
    options = ConversionOptions(quantize="int8", keep_float=["a", "b"])
    assert options.keep_float == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.quantize = "fp16"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "option", "message"),
    [
        ({"quantize": "bf16"}, "quantize", "not a known mode; use one of fp16, int8, int4"),
        ({"quantize": "int4", "block_size": 48}, "block_size", r"one of \(32, 64, 128\) for int4"),
        ({"block_size": 0}, "block_size", "positive int"),
        ({"block_size": "big"}, "block_size", "must be a number"),
        ({"quantize": "fp16", "keep_float": "first_last"}, "keep_float", "add quantize='int8'"),
        ({"accuracy_budget": 0.9}, "accuracy_budget", "apply only to quantize='int8' or 'int4'"),
        ({"quantize": "int8", "accuracy_budget": 1.5}, "accuracy_budget", r"in \(0, 1\], e\.g\. 0\.999"),
        ({"quantize": "int8", "accuracy_budget": "nan"}, "accuracy_budget", "minimum cosine similarity"),
        ({"quantize": "int8", "activations": "kl", "calibration": "s.npz"}, "activations", "minmax"),
        (
            {"quantize": "fp16", "activations": "minmax", "calibration": "s.npz"},
            "quantize",
            "'int8' or 'int4'",
        ),
        ({"quantize": "int8", "activations": "minmax"}, "calibration", "need calibration samples"),
        ({"quantize": "fp16", "activations": "dynamic"}, "quantize", "dynamic int8 activations need"),
        ({"quantize": "int8", "activations": "Dynamic"}, "activations", "dynamic: ranges computed per run"),
        (
            {"quantize": "int8", "precision": "int8"},
            "precision",
            "unknown conversion option.*the options are",
        ),
    ],
)
def test_a_bad_option_is_named_with_what_to_do(fields, option, message):
    with pytest.raises(InvalidOptionsError, match=message) as info:
        ConversionOptions.from_dict(fields)
    assert info.value.option == option


def test_dynamic_activations_need_no_calibration():
    options = ConversionOptions.from_dict({"quantize": "int8", "activations": "dynamic"})
    assert options.activations == "dynamic" and options.calibration is None


def test_separate_arguments_are_checked_as_strictly():
    with pytest.raises(InvalidOptionsError, match="keep_float must be 'first_last'"):
        ConversionOptions(quantize="int8", keep_float="firsts")  # a string is no list of names here
    with pytest.raises(InvalidOptionsError, match="minimum cosine similarity"):
        ConversionOptions(quantize="int8", accuracy_budget=True)


def test_convert_refuses_options_and_separate_arguments_together(tmp_path: Path):
    with pytest.raises(InvalidOptionsError, match="pass quantize inside options=") as info:
        convert(build_image_classifier(), tmp_path / "m.ferry", options=ConversionOptions(), quantize="int8")
    assert info.value.option == "quantize"
    assert not list(tmp_path.iterdir())


def test_convert_with_options_writes_the_same_package_as_with_arguments(tmp_path: Path):
    samples = {"image": np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    separate = convert(
        build_image_classifier(),
        tmp_path / "a.ferry",
        quantize="int8",
        keep_float="first_last",
        calibration=samples,
    )
    options = ConversionOptions(quantize="int8", keep_float="first_last", calibration=samples)
    together = convert(build_image_classifier(), tmp_path / "b.ferry", options=options)
    assert (tmp_path / "a.ferry").read_bytes() == (tmp_path / "b.ferry").read_bytes()
    assert together.float_layers == separate.float_layers and len(together.float_layers) == 2
