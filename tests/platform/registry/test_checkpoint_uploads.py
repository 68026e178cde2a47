"""Language-model and diffusion versions: a checkpoint directory uploaded as one archive through
the REST API, converted by a real Celery worker (PostgreSQL, Redis, the S3 server), its report
and signed package stored like an ONNX version's; hostile archives refused with the member named;
a broken checkpoint a failed job naming the tensor, with no package kept."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.files.storage import default_storage
from django.db import connection
from ferry_cloud.release_key import release_private_key, release_public_key
from registry import archives
from registry.models import Artifact, ModelVersion

from deploy.package import verify_and_unpack
from tests.engine.diffusion import tiny
from tests.engine.llm.checkpoints import write_checkpoint, write_safetensors

ROOT = Path(__file__).resolve().parents[3]


def tar_of(directory: Path, **kwargs) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname=directory.name, **kwargs)
    return buffer.getvalue()


def zip_of(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            archive.write(path, path.relative_to(directory).as_posix())
    return buffer.getvalue()


def tar_with(*members: tarfile.TarInfo, data: bytes = b"{}") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def file_member(name: str, size: int = 2) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def special_member(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def post(api, model_id: int, label: str, data: bytes, **fields):
    return api.post(
        f"/api/v1/models/{model_id}/versions/",
        {"file": io.BytesIO(data), "label": label, **fields},
        format="multipart",
    )


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("llm") / "tiny-qwen"
    write_checkpoint(directory, "qwen2", max_position_embeddings=512)
    return directory


@pytest.fixture(scope="module")
def broken_llm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("broken") / "tiny-llama"
    _, tensors = write_checkpoint(directory, "llama")
    for shard in directory.glob("*.safetensors"):
        shard.unlink()
    kept = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    write_safetensors(directory / "model.safetensors", kept)
    return directory


@pytest.fixture(scope="module")
def diffusion_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.write_layout(tmp_path_factory.mktemp("diffusion") / "tiny-sd")


@pytest.fixture
def model_id(api) -> int:
    return api.post("/api/v1/models/", {"name": "m"}, format="json").json()["id"]


# --- hostile archives and wrong options: 400 before anything is stored ------------------------

HOSTILE = {
    "traversal": (tar_with(file_member("model/../../etc/cron.d/x")), "'model/../../etc/cron.d/x'", "'..'"),
    "absolute": (tar_with(file_member("/etc/passwd")), "'/etc/passwd'", "absolute path"),
    "symlink": (
        tar_with(
            file_member("m/config.json"), special_member("m/w.safetensors", tarfile.SYMTYPE, "/etc/shadow")
        ),
        "'m/w.safetensors'",
        "a link",
    ),
    "hardlink": (
        tar_with(file_member("m/config.json"), special_member("m/x", tarfile.LNKTYPE, "m/config.json")),
        "'m/x'",
        "a link",
    ),
    "device": (tar_with(special_member("m/dev", tarfile.CHRTYPE)), "'m/dev'", "device file"),
    "fifo": (tar_with(special_member("m/pipe", tarfile.FIFOTYPE)), "'m/pipe'", "device file, FIFO"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_tar_is_refused_naming_the_member(api, model_id, case):
    data, member, why = HOSTILE[case]
    response = post(api, model_id, "v1", data, kind="llm")
    assert response.status_code == 400, response.content
    message = response.json()["error"]["message"]
    assert member in message and why in message, message
    assert not Artifact.objects.exists() and not ModelVersion.objects.exists()


def test_a_zip_with_traversal_or_a_symlink_is_refused(api, model_id):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("ok/config.json", "{}")
        archive.writestr("../escape.json", "{}")
    response = post(api, model_id, "v1", buffer.getvalue(), kind="diffusion")
    assert response.status_code == 400 and "'../escape.json'" in response.json()["error"]["message"]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        link = zipfile.ZipInfo("ok/link")
        link.external_attr = (0o120777) << 16
        archive.writestr(link, "/etc/passwd")
    response = post(api, model_id, "v2", buffer.getvalue(), kind="diffusion")
    assert response.status_code == 400 and "'ok/link' is a link" in response.json()["error"]["message"]


def test_too_many_members_or_too_many_bytes_are_refused(api, model_id, settings):
    many = tar_with(*(file_member(f"m/{i}.json") for i in range(archives.MAX_MEMBERS + 1)))
    response = post(api, model_id, "v1", many, kind="llm")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert (
        f"'m/{archives.MAX_MEMBERS}.json'" in message
        and f"more than {archives.MAX_MEMBERS} members" in message
    )
    # a member declaring more than the unpacked limit (a bomb's header), refused unread
    settings.FERRY_MAX_UNPACKED_BYTES = 1000
    bomb = io.BytesIO()
    with tarfile.open(fileobj=bomb, mode="w:gz") as tar:
        tar.addfile(file_member("m/model.safetensors", 5000), io.BytesIO(bytes(5000)))
    response = post(api, model_id, "v2", bomb.getvalue(), kind="llm")
    assert response.status_code == 400
    assert "'m/model.safetensors'" in response.json()["error"]["message"]
    assert "unpacks past 1,000 bytes" in response.json()["error"]["message"]


def test_not_an_archive_and_wrong_options_are_400(api, model_id, llm_dir):
    response = post(api, model_id, "v1", b"certainly not a tar", kind="llm")
    assert response.status_code == 400 and "not a tar or zip" in response.json()["error"]["message"]
    data = tar_of(llm_dir)
    response = post(api, model_id, "v1", data, kind="diffusion", weights="int4")
    assert response.status_code == 400 and "weights" in response.json()["error"]["fields"]
    response = post(api, model_id, "v1", data, kind="llm", quantize="int8")
    assert response.status_code == 400 and "quantize" in response.json()["error"]["fields"]
    response = post(api, model_id, "v1", data, kind="llm", steps=4)
    assert response.status_code == 400 and "steps" in response.json()["error"]["fields"]
    response = post(api, model_id, "v1", data, weights="int8")  # kind onnx
    assert response.status_code == 400 and "weights" in response.json()["error"]["fields"]
    response = post(api, model_id, "v1", data, kind="gguf")
    assert response.status_code == 400 and "kind" in response.json()["error"]["fields"]
    assert not ModelVersion.objects.exists()


def test_extraction_repeats_the_checks_and_finds_the_checkpoint_directory(tmp_path, llm_dir):
    """The worker extracts what upload checked, and checks again: storage is not trusted either."""
    hostile = tmp_path / "hostile.tar"
    hostile.write_bytes(tar_with(file_member("ok/config.json"), file_member("ok/../../evil")))
    (tmp_path / "out").mkdir()
    with pytest.raises(archives.UnsafeArchive, match=r"'ok/\.\./\.\./evil' has '\.\.'"):
        archives.extract_archive(hostile, tmp_path / "out")
    assert not (tmp_path / "evil").exists()
    for name, data in (("nested.tgz", tar_of(llm_dir)), ("flat.zip", zip_of(llm_dir))):
        (tmp_path / name).write_bytes(data)
        (tmp_path / f"x-{name}").mkdir()
        root = archives.extract_archive(tmp_path / name, tmp_path / f"x-{name}")
        assert (root / "config.json").read_bytes() == (llm_dir / "config.json").read_bytes()
        assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in llm_dir.iterdir())


def test_the_openapi_document_declares_the_kind_enum(api):
    document = api.get("/api/schema/?format=json").json()
    schemas = document["components"]["schemas"]
    for component in ("VersionOutput", "VersionInputRequest"):
        kind = schemas[component]["properties"]["kind"]
        ref = kind.get("$ref") or kind["allOf"][0]["$ref"]
        assert ref == "#/components/schemas/VersionKindEnum"
    assert schemas["VersionKindEnum"]["enum"] == ["onnx", "llm", "diffusion", "llm_adapter"]


# --- through a real Celery worker -------------------------------------------------------------


@pytest.fixture
def worker(transactional_db, tmp_path):
    """A Celery worker process on the test database, this suite's broker and the S3 server."""
    release_private_key()  # made now, so the worker signs with the key this process verifies with
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    db = connection.settings_dict
    env = {
        **os.environ,
        "FERRY_DATA_DIR": str(tmp_path / "worker-data"),
        "FERRY_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.CELERY_BROKER_URL,
        "FERRY_RELEASE_KEY_FILE": str(settings.FERRY_RELEASE_KEY_FILE),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "ferry_cloud", "worker", "--pool", "solo", "-l", "INFO"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    yield child, log
    child.terminate()
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _finished(api, version_id: str, worker, timeout: float = 400.0) -> dict:
    child, log = worker
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert child.poll() is None, log.read_text(errors="replace")[-3000:]
        body = api.get(f"/api/v1/versions/{version_id}/").json()
        if body["job"]["status"] in ("succeeded", "failed"):
            return body
        time.sleep(0.5)
    raise AssertionError(f"job not finished: {body['job']}\n{log.read_text(errors='replace')[-3000:]}")


def _unpacked_manifest(package_name: str, tmp_path: Path) -> dict:
    tmp_path.mkdir()
    local = tmp_path / "downloaded.ferry"
    with default_storage.open(package_name, "rb") as src:
        local.write_bytes(src.read())
    verify_and_unpack(local, tmp_path / "unpacked", release_public_key())
    return json.loads((tmp_path / "unpacked" / "manifest.json").read_text())


@pytest.mark.slow
def test_llm_and_diffusion_archives_convert_on_a_worker_and_release_like_onnx(
    api, worker, llm_dir, diffusion_dir, broken_llm_dir, tmp_path
):
    model_id = api.post("/api/v1/models/", {"name": "chat"}, format="json").json()["id"]
    llm = post(api, model_id, "int8", tar_of(llm_dir), kind="llm", weights="int8")
    assert llm.status_code == 201, llm.content
    assert llm.json()["kind"] == "llm" and llm.json()["options"] == {"weights": "int8", "block_size": 32}
    broken = post(api, model_id, "broken", zip_of(broken_llm_dir), kind="llm")
    assert broken.status_code == 201, broken.content
    sd = api.post("/api/v1/models/", {"name": "sd"}, format="json").json()["id"]
    image = post(
        api, sd, "int8", tar_of(diffusion_dir), kind="diffusion", weights="int8", image_size=64, steps=2
    )
    assert image.status_code == 201, image.content

    body = _finished(api, llm.json()["id"], worker)
    assert body["status"] == "ready", body["job"]
    assert body["kind"] == "llm" and body["report"]["precision"] == "int8"
    accuracy = body["report"]["accuracy"]
    assert 0.9 <= accuracy["top1_agreement"] <= 1.0 and 0 <= accuracy["mean_kl"] < 5e-3
    assert accuracy["perplexity"] > 1.0 and body["report"]["source"] == "the uploaded archive"
    messages = [line["message"] for line in body["job"]["log"]]
    assert any("storing weights at int8" in m for m in messages)
    assert any(m.startswith("accuracy of int8 vs fp32") and "top-1 agreement" in m for m in messages)
    assert any("signed" in m for m in messages)
    version = ModelVersion.objects.get(pk=body["id"])
    manifest = _unpacked_manifest(version.package.file.name, tmp_path / "llm")
    assert manifest["metadata"]["kind"] == "llm" and manifest["metadata"]["llm"]["precision"] == "int8"
    assert version.package.kind == Artifact.Kind.PACKAGE and version.source.kind == Artifact.Kind.ARCHIVE

    release = api.post(
        "/api/v1/releases/", {"name": "chat-int8", "version": body["id"], "allow_empty": True}, format="json"
    )
    assert release.status_code == 201, release.content

    failed = _finished(api, broken.json()["id"], worker)
    assert failed["status"] == "failed" and failed["job"]["status"] == "failed"
    assert "'model.layers.1.mlp.up_proj.weight' is missing" in failed["job"]["error"], failed["job"]["error"]
    assert "/tmp" not in failed["job"]["error"] and failed["package_sha256"] is None

    done = _finished(api, image.json()["id"], worker)
    assert done["status"] == "ready", done["job"]
    report = done["report"]
    assert done["kind"] == "diffusion" and report["precision"] == "int8"
    assert set(report["graphs"]) == {"text_encoder", "unet", "vae_decoder"}
    assert all(g["accuracy"]["outputs"] for g in report["graphs"].values())
    assert report["pipeline"]["psnr_db"] > 10 and 0 < report["pipeline"]["ssim"] <= 1
    assert any("image PSNR" in line["message"] for line in done["job"]["log"])
    manifest = _unpacked_manifest(ModelVersion.objects.get(pk=done["id"]).package.file.name, tmp_path / "sd")
    assert manifest["metadata"]["kind"] == "diffusion"
    # only the two packages: the broken checkpoint left nothing behind
    assert Artifact.objects.filter(kind=Artifact.Kind.PACKAGE).count() == 2
    listed = api.get("/api/v1/versions/", {"kind": "diffusion"}).json()["results"]
    assert [v["id"] for v in listed] == [done["id"]]
