from __future__ import annotations

import io

import onnx
import pytest
from accounts.models import Membership
from accounts.services import organisation_ensure, user_ensure_admin
from accounts.tokens import api_token_create
from django.contrib.auth import get_user_model
from registry.models import ModelVersion
from registry.services import conversion_run
from rest_framework.test import APIClient

from converter.samples import build_image_classifier


@pytest.fixture
def org(db):
    return organisation_ensure(name="Acme")


@pytest.fixture
def admin(org):
    user, token = user_ensure_admin(organisation=org, username="alice", password="correct horse")
    return user, token


@pytest.fixture
def api(admin) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {admin[1]}")
    return client


def member_of(organisation, username: str, role: str) -> tuple[object, str]:
    """A user of the organisation with that role, and its API token."""
    user = get_user_model().objects.create_user(username=username, password="correct horse")
    membership = Membership.objects.create(user=user, organisation=organisation, role=role)
    return user, api_token_create(membership=membership).token


@pytest.fixture
def viewer(org):
    return member_of(org, "victor", Membership.Role.VIEWER)


@pytest.fixture
def operator(org):
    """A member with the stored role release_manager, the operator."""
    return member_of(org, "olga", Membership.Role.RELEASE_MANAGER)


@pytest.fixture
def outsider(db):
    """An admin of another organisation: every one of Acme's rows must be 404 to them."""
    return member_of(organisation_ensure(name="Globex"), "mallory", Membership.Role.ADMIN)


def onnx_bytes(model: onnx.ModelProto | None = None) -> bytes:
    return (model or build_image_classifier()).SerializeToString()


def upload(api: APIClient, model_id: int, label: str, data: bytes, **fields):
    return api.post(
        f"/api/v1/models/{model_id}/versions/",
        {"file": io.BytesIO(data), "label": label, **fields},
        format="multipart",
    )


@pytest.fixture
def ready_version(api) -> ModelVersion:
    """A converted version, made through the API and the real conversion service."""
    model = api.post("/api/v1/models/", {"name": "classifier"}, format="json").json()
    created = upload(api, model["id"], "v1", onnx_bytes())
    assert created.status_code == 201, created.content
    version = ModelVersion.objects.get(pk=created.json()["id"])
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.READY, version.job.error
    return version
