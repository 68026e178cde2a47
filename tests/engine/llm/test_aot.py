"""The ahead-of-time LLM kernels (engine/llm/aot.py): the same bits as numba's, numba never
imported by a process that serves on them, the numba path when none is built, and an extension
built for other kernel sources never loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from converter.llm.convert import _int8_activations
from engine import jit
from engine.llm import aot
from engine.llm.checkpoint import Checkpoint
from engine.llm.config import parse_config
from engine.llm.model import LlmModel, weights_from_checkpoint
from tests.engine.llm.checkpoints import config_dict, random_tensors
from tests.engine.llm.test_decode_spread import _spin_until_released

PROMPT = [5, 17, 42, 3, 99, 7, 250, 12, 64]
STEPS = 5
ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not jit.enabled(), reason="building the extension needs numba")


@pytest.fixture(scope="module")
def built() -> Path:
    """The extension for this tree (built once into the JIT cache, as activation does)."""
    return aot.build()


def _model(precision: str) -> LlmModel:
    """A tiny checkpoint as convert_llm stores it: int8 activations, the dot layouts."""
    hf = config_dict("llama")
    checkpoint = Checkpoint(directory=Path("."), config=parse_config(hf), tensors=random_tensors(hf, seed=5))
    weights = weights_from_checkpoint(checkpoint, precision, 32)
    _int8_activations(weights)
    return LlmModel(checkpoint.config, weights)


def _generate(precision: str, kind: str) -> tuple[list[np.ndarray], object]:
    """Prefill then STEPS greedy steps on a fresh model: (every step's logits, the kernels used)."""
    model = _model(precision)
    cache = model.new_cache(kind=kind)
    logits = [model.forward(PROMPT, cache)]
    for _ in range(STEPS):
        logits.append(model.forward([int(np.argmax(logits[-1]))], cache))
    buffers = model._decode_buffers()
    assert buffers is not None
    return logits, buffers.kernels


@pytest.mark.parametrize("precision", ["int4", "int8"])
@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_aot_kernels_give_numbas_bits(built: Path, precision: str, kind: str, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("FERRY_LLM_AOT", "1")
    compiled, kernels = _generate(precision, kind)
    assert isinstance(kernels, aot.AotKernels)
    monkeypatch.setenv("FERRY_LLM_AOT", "0")
    numba_logits, numba_kernels = _generate(precision, kind)
    assert numba_kernels is jit.module("engine.llm.layer_jit")
    assert len(compiled) == STEPS + 1
    for step, (a, b) in enumerate(zip(compiled, numba_logits, strict=True)):
        assert a.shape == b.shape == (256,)
        if kind == "fp32":
            assert np.array_equal(a, b), f"step {step}: max |diff| {np.abs(a - b).max()}"
        else:
            # the int8 cache's attention and softmax are fastmath (reassociated) reductions that
            # pycc's LLVM pipeline vectorises differently from the JIT's once 8+ positions are
            # cached: the last bit of a few logits (measured <= 4.8e-7 over 30 steps), no more
            assert np.abs(a - b).max() <= 1e-6 * max(1.0, np.abs(b).max()), f"step {step}"
            assert np.argmax(a) == np.argmax(b)


def test_serving_on_aot_kernels_never_imports_numba(built: Path) -> None:
    script = (
        "import sys, json\n"
        "import numpy as np\n"
        "from engine.llm.checkpoint import Checkpoint\n"
        "from engine.llm.config import parse_config\n"
        "from engine.llm.model import LlmModel, weights_from_checkpoint\n"
        "from engine.llm.weights import gemv_kernel\n"
        "from converter.llm.convert import _int8_activations\n"
        "from tests.engine.llm.checkpoints import config_dict, random_tensors\n"
        "hf = config_dict('llama')\n"
        "c = Checkpoint(directory='.', config=parse_config(hf), tensors=random_tensors(hf, seed=5))\n"
        "w = weights_from_checkpoint(c, 'int4', 32)\n"
        "_int8_activations(w)\n"
        "gemv_kernel('LlmGemvInt4')\n"
        "from engine.llm import threads\n"
        "model = LlmModel(c.config, w)\n"
        "steps = []\n"
        "for n in (1, 2):\n"
        "    with threads.running_on(n):  # 2: prefill parts and spread.py's decode, GIL released\n"
        "        cache = model.new_cache()\n"
        "        logits = [model.forward(list(range(5, 50)), cache)]\n"
        "        for _ in range(4):\n"
        "            logits.append(model.forward([int(np.argmax(logits[-1]))], cache))\n"
        "        steps.append(np.array(logits))\n"
        "        fused = model._decode_buffers()\n"
        "print(json.dumps({'numba': 'numba' in sys.modules, 'llvmlite': 'llvmlite' in sys.modules,\n"
        "    'aot': type(fused.kernels).__name__, 'spread': type(fused.spread_kernels).__name__,\n"
        "    'same': bool(np.array_equal(*steps))}))\n"
    )
    env = dict(os.environ, FERRY_LLM_AOT="1", FERRY_JIT_CACHE=str(jit.cache_dir()))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "platform"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {
        "numba": False,
        "llvmlite": False,
        "aot": "AotKernels",
        "spread": "AotKernels",
        "same": True,
    }


def test_aot_decode_workers_release_the_gil(built: Path) -> None:
    _spin_until_released(aot=True)


def test_no_extension_means_the_numba_path(built: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    jit.module("engine.llm.layer_jit")  # numba's cache already configured: only aot looks here
    jit.module("engine.llm.dot_jit")
    monkeypatch.setenv("FERRY_JIT_CACHE", str(tmp_path))
    monkeypatch.setenv("FERRY_LLM_AOT", "1")
    assert not aot.path().exists()
    assert aot.kernels() is None
    logits, kernels = _generate("int4", "fp32")
    assert kernels is jit.module("engine.llm.layer_jit")
    assert all(np.isfinite(step).all() for step in logits)


def test_an_extension_for_other_kernel_sources_is_not_used(built: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("FERRY_LLM_AOT", "1")
    assert built.exists() and aot.kernels() is not None
    stale = aot.path(engine_version="an older engine")
    assert stale != built and stale.parent == built.parent
    assert aot.kernels(engine_version="an older engine") is None  # built's file is there, not its
    monkeypatch.setenv("FERRY_LLM_AOT", "0")
    assert aot.kernels() is None  # switched off: never loaded


def test_building_removes_the_extensions_of_other_keys(built: Path) -> None:
    stale = aot.path(engine_version="an older engine")
    stale.write_bytes(b"an old extension")
    stale.with_suffix(".json").write_text("{}")
    assert aot.build() == built
    assert built.exists() and built.with_suffix(".json").exists()
    assert not stale.exists() and not stale.with_suffix(".json").exists()


def test_on_by_default_and_never_without_the_jit_tier(built: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("FERRY_LLM_AOT", raising=False)
    assert aot.kernels() is not None  # the serving default, once activation has built it
    monkeypatch.setenv("FERRY_JIT", "0")  # numpy only: no compiled kernels of any kind
    assert aot.kernels() is None and not aot.prepare()
