"""A version's console page shows the report its kind has: a language model's next-token figures
against fp32, an adapter's rank and base binding (with a link to the base version), a diffusion
pipeline's graphs and image PSNR/SSIM; none shows the ONNX report's fields, left blank."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from django.test import Client

from tests.console.test_console_diffusion_sample import layout_tar  # noqa: F401
from tests.engine.llm.checkpoints import write_checkpoint, write_peft
from tests.platform.conftest import upload
from tests.platform.registry.test_adapter_versions import _converted, _llm, _model
from tests.platform.registry.test_checkpoint_uploads import post, tar_of

ONNX_ONLY = ("Operators (graph nodes)", "Inputs and outputs", "opset")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report-kinds")
    config, _ = write_checkpoint(root / "tiny", "qwen2", max_position_embeddings=64)
    write_peft(root / "pirate", config)
    return {"tiny": root / "tiny", "pirate": root / "pirate"}


def page_text(user, version_id) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/versions/{version_id}/")
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def cells(text: str, table_id: str) -> list[str]:
    table = re.search(rf'<table id="{table_id}">.*?</table>', text, re.S)
    assert table, f"no table #{table_id}"
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", table.group(0), re.S)]


@pytest.mark.django_db(transaction=True)
def test_llm_and_adapter_pages_show_their_own_reports(api, viewer, checkpoints):
    base = _llm(api, checkpoints["tiny"], "tiny")
    text = page_text(viewer[0], base.pk)
    accuracy = base.report["accuracy"]
    row = cells(text, "llm-accuracy")
    assert row[0] == str(accuracy["tokens"])
    assert float(row[1]) == pytest.approx(accuracy["top1_agreement"], abs=1e-4)
    assert float(row[2]) == pytest.approx(accuracy["mean_kl"], rel=1e-3, abs=1e-5)
    assert "int8" in text and base.report["model_type"] in text
    assert not [field for field in ONNX_ONLY if field in text]

    created = post(
        api, _model(api, "pirate"), "v1", tar_of(checkpoints["pirate"]), kind="llm_adapter", base=str(base.pk)
    )
    adapter = _converted(created)
    text = page_text(viewer[0], adapter.pk)
    assert f'href="/versions/{base.pk}/"' in text  # the base it was converted against
    assert f"rank {adapter.report['rank']}" in text and adapter.report["base_digest"][:12] in text
    assert "<code>pirate</code>" in text  # its name in the device's chat API
    assert not [field for field in ONNX_ONLY if field in text]


@pytest.mark.django_db(transaction=True)
def test_a_diffusion_page_shows_its_graphs_and_image_figures(api, viewer, layout_tar):  # noqa: F811
    model = _model(api, "painter")
    created = upload(api, model, "v1", layout_tar, kind="diffusion", weights="int8", image_size=64, steps=2)
    version = _converted(created)
    text = page_text(viewer[0], version.pk)
    report = version.report
    table = cells(text, "diffusion-graphs")
    assert [table[i] for i in range(0, len(table), 6)] == ["text_encoder", "unet", "vae_decoder"]
    unet = report["graphs"]["unet"]
    assert table[7] == f"{unet['nodes_before']} → {unet['nodes_after']}"
    pipeline = report["pipeline"]  # int8: the image against fp32's, same seed and prompt
    assert f"PSNR {pipeline['psnr_db']:.2f} dB, SSIM {pipeline['ssim']:.4f}" in text
    assert f"{round(report['size_ratio'] * 100)}%" in text
    assert not [field for field in ONNX_ONLY if field in text]
