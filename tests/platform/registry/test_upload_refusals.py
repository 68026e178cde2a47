"""Hostile uploads: too large (refused while reading, 413, nothing stored) and ONNX files whose
tensors point at external data (path tricks of the CVE-2022-25882 / CVE-2024-27318 class)."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data
from registry.models import Artifact, ModelVersion
from registry.onnx_checks import ExternalDataRefused, check_self_contained
from registry.upload_limits import SizeLimitedMultiPartParser
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from tests.platform.conftest import onnx_bytes, upload


@pytest.fixture
def model_id(api) -> int:
    return api.post("/api/v1/models/", {"name": "m"}, format="json").json()["id"]


def _nothing_stored() -> bool:
    return not ModelVersion.objects.exists() and not Artifact.objects.exists()


def test_a_file_over_the_limit_is_413_and_nothing_is_stored(api, model_id, settings):
    data = onnx_bytes()
    settings.FERRY_MAX_UPLOAD_BYTES = len(data) - 1
    refused = upload(api, model_id, "v1", data)
    assert refused.status_code == 413
    error = refused.json()["error"]
    assert error["code"] == "request_too_large"
    assert f"{len(data) - 1:,} bytes" in error["message"]
    assert tempfile.gettempdir() not in json.dumps(error)
    assert _nothing_stored()
    settings.FERRY_MAX_UPLOAD_BYTES = len(data)
    assert upload(api, model_id, "v1", data).status_code == 201  # at the limit: accepted


def test_a_declared_length_over_the_limit_is_refused_before_reading(api, model_id, settings):
    settings.FERRY_MAX_UPLOAD_BYTES = 1000
    refused = api.generic(
        "POST",
        f"/api/v1/models/{model_id}/versions/",
        data=b"",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH=str(10**12),
    )
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "request_too_large"
    assert _nothing_stored()


class CountingStream(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.served = 0

    def read(self, size: int = -1) -> bytes:
        chunk = super().read(size)
        self.served += len(chunk)
        return chunk


def test_reading_stops_at_the_limit_not_at_the_end_of_the_body(db):
    limit = 64 * 1024
    body_request = APIRequestFactory().post(
        "/upload/", {"label": "v1", "file": io.BytesIO(b"\0" * (16 * limit))}, format="multipart"
    )
    body = body_request.read()
    stream = CountingStream(body)
    request = Request(body_request)
    parser = SizeLimitedMultiPartParser(limits={"file": limit, "calibration": limit})
    with pytest.raises(APIException, match="larger than its limit of 65,536 bytes") as refused:
        parser.parse(stream, body_request.META["CONTENT_TYPE"], {"request": request})
    assert refused.value.status_code == 413
    assert stream.served < len(body) / 4  # it stopped early, it did not spool the rest


# ---- ONNX external data ------------------------------------------------------------------------


def _external(tensor: TensorProto, location: str) -> TensorProto:
    set_external_data(tensor, location=location, offset=0, length=16)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    return tensor


def _add_model(weight: TensorProto, *, extra_nodes=()) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [*extra_nodes, helper.make_node("Add", ["x", weight.name], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weight(name: str = "w") -> TensorProto:
    return numpy_helper.from_array(np.ones(4, dtype=np.float32), name)


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("../../../../etc/passwd", "leaving the model's directory"),
        ("weights/../../secret.bin", "leaving the model's directory"),
        ("/etc/passwd", "an absolute path"),
        ("C:\\Windows\\win.ini", "an absolute path"),
        ("link-to-somewhere", "a file beside it"),  # a symlink planted next to the copy
        ("", "no file named"),
    ],
)
def test_an_initializer_with_external_data_is_refused(api, model_id, location, why):
    model = _add_model(_external(_weight(), location))
    refused = upload(api, model_id, "v1", model.SerializeToString())
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "external_data_refused"
    assert "initializer 'w'" in error["message"] and why in error["message"]
    assert "save_as_external_data=False" in error["message"]
    assert tempfile.gettempdir() not in error["message"]
    assert _nothing_stored()


def test_external_data_hidden_in_a_constant_or_a_subgraph_is_refused(api, model_id):
    constant = helper.make_node(
        "Constant", [], ["c"], name="const", value=_external(_weight("c"), "../c.bin")
    )
    assert (
        upload(api, model_id, "v1", _add_model(_weight(), extra_nodes=[constant]).SerializeToString()).json()[
            "error"
        ]["code"]
        == "external_data_refused"
    )

    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])
    branch = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["b"])],
        "branch",
        [],
        [branch_out],
        initializer=[_external(_weight("inner"), "/proc/self/environ")],
    )
    cond = helper.make_node(
        "Constant", [], ["cond"], value=helper.make_tensor("k", TensorProto.BOOL, [], [True])
    )
    if_node = helper.make_node("If", ["cond"], ["z"], name="if", then_branch=branch, else_branch=branch)
    refused = upload(
        api, model_id, "v1", _add_model(_weight(), extra_nodes=[cond, if_node]).SerializeToString()
    )
    assert refused.status_code == 400
    assert "initializer 'inner'" in refused.json()["error"]["message"]
    assert _nothing_stored()


def test_a_self_contained_model_is_accepted(api, model_id):
    created = upload(api, model_id, "v1", _add_model(_weight()).SerializeToString())
    assert created.status_code == 201, created.content


def test_the_check_skips_tensor_data_instead_of_reading_it():
    big = numpy_helper.from_array(np.ones(1 << 18, dtype=np.float32), "w")  # 1 MiB of weights
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 18])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 18])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [big])
    data = helper.make_model(graph).SerializeToString()
    stream = CountingStream(data)
    check_self_contained(stream)
    assert stream.served < 4096 and stream.tell() == 0


@given(st.binary(max_size=512))
def test_hostile_bytes_never_crash_the_check(data):
    stream = io.BytesIO(data)
    with contextlib.suppress(ExternalDataRefused):
        check_self_contained(stream)
    assert stream.tell() == 0
