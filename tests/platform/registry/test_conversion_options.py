"""Per-version converter options through the REST API and the real conversion job: precision,
int4 block size, calibration set, mixed precision; the accuracy report and readable failures."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from registry.models import ModelVersion
from registry.services import conversion_run

from engine.format import read_package
from tests.converter import models
from tests.platform.conftest import onnx_bytes, upload


def npz(**arrays) -> io.BytesIO:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    buffer.name = "calibration.npz"
    return buffer


@pytest.fixture
def model_id(api) -> int:
    return api.post("/api/v1/models/", {"name": "classifier"}, format="json").json()["id"]


def convert_version(response) -> ModelVersion:
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    return version


def test_int4_with_calibration_and_mixed_precision(api, model_id, tmp_path):
    images = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    version = convert_version(
        upload(
            api,
            model_id,
            "v1",
            onnx_bytes(),
            quantize="int4",
            block_size=64,
            keep_float="first_last",
            calibration=npz(image=images),
        )
    )
    assert version.status == ModelVersion.Status.READY, version.job.error
    body = api.get(f"/api/v1/versions/{version.pk}/").json()
    report = body["report"]
    assert body["options"]["quantize"] == "int4" and body["options"]["calibration"]["size"] > 0
    assert (report["quantize"], report["block_size"]) == ("int4", 64)
    assert report["float_layers"] == ["conv1", "fc"] and report["quantized_weights"] == ["conv2.weight"]
    assert report["accuracy"]["inputs"] == "calibration" and report["accuracy"]["samples"] == 1
    figures = report["accuracy"]["outputs"]["probabilities"]
    assert figures["cosine_similarity"] > 0.99 and 0 <= figures["top1_agreement"] <= 1
    log = [line["message"] for line in body["job"]["log"]]
    assert any(
        m.startswith("accuracy vs float32 on 1 calibration input(s): probabilities: cosine") for m in log
    )
    assert "quantizing weights (int4)" in log
    local = tmp_path / "package.ferry"
    with version.package.file.open("rb") as stream:
        local.write_bytes(stream.read())
    assert read_package(local).manifest["metadata"]["report"]["accuracy"] == report["accuracy"]


def test_static_int8_activations_option(api, model_id):
    images = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    response = upload(
        api,
        model_id,
        "v1",
        onnx_bytes(),
        quantize="int8",
        activations="percentile",
        calibration=npz(image=images),
    )
    version = convert_version(response)
    assert version.status == ModelVersion.Status.READY, version.job.error
    assert version.report["activations"] == "percentile"
    assert sorted(version.report["activation_ranges"]) == ["features", "image", "pool1"]


def test_accuracy_budget_option(api, model_id):
    version = convert_version(upload(api, model_id, "v1", onnx_bytes(), quantize="int8", accuracy_budget=0.9))
    assert version.status == ModelVersion.Status.READY, version.job.error
    assert version.options["accuracy_budget"] == 0.9
    assert version.report["accuracy"]["outputs"]["probabilities"]["cosine_similarity"] >= 0.9


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"quantize": "int8", "accuracy_budget": 1.5}, "accuracy_budget"),
        ({"quantize": "int4", "block_size": 48}, "block_size"),
        ({"quantize": "int8", "keep_float": "<script>"}, "keep_float"),
    ],
)
def test_bad_options_are_refused_by_field(api, model_id, fields, field):
    response = upload(api, model_id, "v1", onnx_bytes(), **fields)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not ModelVersion.objects.exists()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"quantize": "fp16", "keep_float": "first_last"}, "apply only to quantize='int8' or 'int4'"),
        ({"quantize": "int8", "calibration": io.BytesIO(b"not a zip")}, "must be an .npz"),
        ({"quantize": "int8", "activations": "minmax"}, "static int8 activations need calibration samples"),
    ],
)
def test_bad_option_combinations_are_refused(api, model_id, fields, message):
    response = upload(api, model_id, "v1", onnx_bytes(), **fields)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert not ModelVersion.objects.exists()


@pytest.mark.parametrize(
    ("data", "fields", "message"),
    [
        (
            onnx_bytes(),
            {"quantize": "int8", "calibration": npz(pixels=np.zeros(3))},
            "inputs ['image'] missing",
        ),
        (
            onnx_bytes(models.two_unsupported_ops()),
            {},
            "2 unsupported operator(s): Hardmax (nodes: hard, Hardmax_3); ReduceLogSumExp (nodes: lse)",
        ),
        (
            onnx_bytes(
                models.model(
                    [onnx.helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
                    [models.fvalue("x", [2])],
                    [models.fvalue("y", [2])],
                )
            ),
            {},
            "node 'add' (Add) reads 'ghost', which no graph input, initializer or node produces",
        ),
    ],
    ids=["calibration-inputs", "unsupported-ops", "dangling-input"],
)
def test_bad_models_and_samples_fail_the_job_readably(api, model_id, data, fields, message):
    version = convert_version(upload(api, model_id, "v1", data, **fields))
    assert version.status == ModelVersion.Status.FAILED
    assert message in version.job.error and "\n" not in version.job.error
    assert version.package is None
