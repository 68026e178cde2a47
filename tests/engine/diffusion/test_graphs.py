"""Each graph of the tiny pipeline, converted by the ordinary converter, against onnxruntime on
the source ONNX (1e-4 at fp32), at several batch sizes and latent sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engine import Session
from tests.engine.diffusion import tiny


def feeds(graph: str, batch: int, h: int, w: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if graph == "text_encoder":
        return {"input_ids": rng.integers(0, tiny.vocab_size(), (batch, tiny.MAX_LENGTH)).astype(np.int32)}
    if graph == "unet":
        return {
            "sample": rng.standard_normal((batch, tiny.LATENT, h, w), dtype=np.float32),
            "timestep": np.full((batch,), 721, np.int64),
            "encoder_hidden_states": rng.standard_normal(
                (batch, tiny.MAX_LENGTH, tiny.TEXT_WIDTH), dtype=np.float32
            ),
        }
    return {"latent_sample": rng.standard_normal((batch, tiny.LATENT, h, w), dtype=np.float32) * 5}


CASES = [(1, 8, 8), (2, 8, 8), (2, 12, 6), (1, 4, 10)]


@pytest.mark.parametrize("graph", ["text_encoder", "unet", "vae_decoder"])
def test_graph_matches_onnxruntime(fp32_package, tiny_layout: Path, graph: str) -> None:
    reference = ort.InferenceSession(str(tiny_layout / graph / "model.onnx"))
    names = [o.name for o in reference.get_outputs()]
    session = Session(fp32_package.directory / f"{graph}.ferry", verify=False)
    for batch, h, w in CASES:
        inputs = feeds(graph, batch, h, w, seed=batch * 100 + h)
        expected = dict(zip(names, reference.run(None, inputs), strict=True))
        for _ in range(3):  # recorded, planned, then the plan's run
            got = session.run(inputs)
        for name in names:
            np.testing.assert_allclose(
                got[name], expected[name], rtol=1e-4, atol=1e-4, err_msg=f"{graph} {name}"
            )


def test_archive_members_verify_by_default(fp32_package) -> None:
    """A nested graph opened straight from an archive path is hashed (nothing verified it);
    from the unpacked package, ``verify=False`` skips what the package's unpack already hashed."""
    session = Session(fp32_package.directory / "unet.ferry")
    assert [s.name for s in session.inputs] == ["sample", "timestep", "encoder_hidden_states"]
