"""``convert_llm``: a Hugging Face checkpoint directory -> a Ferry LLM package (engine/llm/package.py).

Refused before anything is written, with the field or tensor named: a config the runtime
cannot run, tensors missing or of the wrong shape, a truncated shard, a tokenizer whose ids do
not fit the embedding.  The package is written to ``<dst>.tmp`` and renamed, so a failure
midway leaves nothing under ``dst`` (and the temporary file is removed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converter.convert import package_destination
from converter.errors import ConversionError, InvalidModelError
from converter.llm.accuracy import compare
from deploy.package import MANIFEST, Manifest
from deploy.package.writer import write_archive
from engine.llm import gemv
from engine.llm.checkpoint import Checkpoint, load_checkpoint
from engine.llm.errors import LlmError
from engine.llm.gemv import HALF_MAX
from engine.llm.generate import generate
from engine.llm.model import LlmModel, LlmWeights, weights_from_checkpoint
from engine.llm.package import GENERATION, INDEX, KIND, WEIGHTS, serialize
from engine.llm.sampler import SamplingOptions
from engine.llm.tokenizer import LlmTokenizer

PRECISIONS = ("fp32", "fp16", "int8", "int4")
BLOCKS = (32, 64)
DEFAULT_TEXT = Path(__file__).with_name("sample_text.txt")
ACCURACY_TOKENS = 512  # the report's text is cut here: a prefill's worth, seconds on a laptop
SELFTEST_PROMPT = "The"
SELFTEST_TOKENS = 8
GENERATION_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens")
Progress = Callable[[float, str], None]


@dataclass
class LlmConversionReport:
    source: str
    precision: str
    block: int
    model_type: str
    parameters: int
    checkpoint_bytes: int
    weights_bytes: int
    package_size: int
    accuracy: dict[str, Any]
    selftest: dict[str, Any]
    seconds: float
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def convert_llm(
    source: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    weights: str = "int4",
    block: int = 32,
    text: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> LlmConversionReport:
    """Convert the checkpoint directory ``source`` into the package ``dst``."""
    started = time.perf_counter()
    report_progress = progress or (lambda fraction, message: None)
    if weights not in PRECISIONS:
        raise ConversionError(f"--weights {weights!r} is not one of {', '.join(PRECISIONS)}")
    if block not in BLOCKS:
        raise ConversionError(f"--block {block} is not one of {', '.join(map(str, BLOCKS))}")
    dst = package_destination(dst)
    sample = _text(text)
    report_progress(0.05, "reading the checkpoint")
    try:
        checkpoint = load_checkpoint(source)
        tokenizer = LlmTokenizer.from_directory(source)
        tokenizer.check_fits(checkpoint.config.vocab_size)
        report_progress(0.2, f"storing weights at {weights}")
        reference = LlmModel(checkpoint.config, weights_from_checkpoint(checkpoint, "fp32"))
        converted_weights = weights_from_checkpoint(checkpoint, weights, block)
        _int8_activations(converted_weights)
        converted = reference if weights == "fp32" else LlmModel(checkpoint.config, converted_weights)
        report_progress(0.5, "measuring accuracy against fp32")
        tokens = tokenizer.encode(sample)[:ACCURACY_TOKENS]
        accuracy = {"precision": weights, "block": block if weights == "int4" else None}
        accuracy |= compare(reference, converted, tokens)
        selftest = _selftest(converted, tokenizer)
    except LlmError as exc:
        raise InvalidModelError(str(exc)) from exc
    except ValueError as exc:
        raise ConversionError(str(exc)) from exc
    report_progress(0.8, "writing the package")
    index, data = serialize(checkpoint.config, converted_weights, weights, block)
    files = [(INDEX, index), (WEIGHTS, data), *_side_files(Path(source), sample, accuracy)]
    metadata = {
        "kind": KIND,
        "llm": {
            "model_type": checkpoint.config.model_type,
            "precision": weights,
            "block": block if weights == "int4" else None,
            "context_length": checkpoint.config.max_positions,
            "vocab_size": checkpoint.config.vocab_size,
            "accuracy": accuracy,
            "selftest": selftest,
        },
    }
    _write(dst, files, metadata)
    report_progress(1.0, "done")
    return LlmConversionReport(
        source=str(source),
        precision=weights,
        block=block,
        model_type=checkpoint.config.model_type,
        parameters=_parameters(checkpoint),
        checkpoint_bytes=checkpoint.size_bytes(),
        weights_bytes=len(data),
        package_size=dst.stat().st_size,
        accuracy=accuracy,
        selftest=selftest,
        seconds=time.perf_counter() - started,
        files=[name for name, _ in files],
    )


def _int8_activations(weights: LlmWeights) -> None:
    """Packages store their int4 matrices as q4_0 does (float16 block scales) and multiply them
    by x rounded to int8 per block, as llama.cpp's q4_0 x q8_0 does (engine/llm/gemv.py), in
    the dot layout where 16 divides the rows (engine/llm/dot_jit.py's 4-byte dot products,
    2-4x the int16 kernel); int8 matrices likewise go to the int8 dot layout (x rounded per
    block of 32, q8_0 x q8_0's arithmetic: dot_jit.py) where 16 divides the rows and 32 the
    inputs.  The accuracy report, measured after this, includes the roundings."""
    matrices = [weights.embed, weights.lm_head]
    for layer in weights.layers:
        matrices += [layer.qkv, layer.o, layer.gate_up, layer.down]
    for matrix in matrices:
        scale = matrix.arrays.get("scale")
        n, k = matrix.shape
        if matrix.kind == "int8" and matrix.group == 1 and gemv.int8_dot_layout(n, k, "int8"):
            matrix.arrays["q"] = gemv.int8_to_dot(matrix.arrays["q"])
            matrix.block, matrix.group, matrix.activations = gemv.BLOCKS[0], gemv.DOT_GROUP, "int8"
        if matrix.kind == "int4" and scale.dtype == np.float32 and np.abs(scale).max() <= HALF_MAX:
            # float16 scales (q4_0's): q stays as chosen against the float32 scale, as llama.cpp's
            matrix.arrays["scale"] = scale.astype(np.float16)
            matrix.activations = "int8"
            if gemv.dot_layout(matrix.shape[0], matrix.activations):
                arrays = gemv.regroup(matrix.arrays["q"], matrix.arrays["scale"], matrix.block, matrix.group)
                matrix.arrays["q"], matrix.arrays["scale"] = arrays
                matrix.group = gemv.DOT_GROUP


def _text(text: str | os.PathLike[str] | None) -> str:
    path = Path(text) if text is not None else DEFAULT_TEXT
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path}: cannot read the accuracy text ({exc})") from exc


def _selftest(model: LlmModel, tokenizer: LlmTokenizer) -> dict[str, Any]:
    """Greedy tokens from a fixed prompt: a device's health check regenerates and compares them."""
    prompt = tokenizer.encode(SELFTEST_PROMPT) or [0]
    count = max(1, min(SELFTEST_TOKENS, model.config.max_positions - len(prompt)))
    result = generate(
        model, tokenizer, prompt, max_tokens=count, options=SamplingOptions(temperature=0), stop_tokens=[]
    )
    return {"prompt_tokens": prompt, "tokens": result.tokens}


def _compact_json(raw: bytes) -> bytes:
    """JSON without its indentation (tokenizers saves pretty-printed by default: SmolLM2's
    vocabulary and merges take 1.58 MB so, 0.69 MB compact; the same document, key order kept);
    bytes that are not JSON are kept as they are (loading the tokenizer has checked them)."""
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False, separators=(",", ":")).encode()
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return raw


def _side_files(source: Path, sample: str, accuracy: dict[str, Any]) -> list[tuple[str, bytes]]:
    files = [("tokenizer.json", _compact_json((source / "tokenizer.json").read_bytes()))]
    if (source / "tokenizer_config.json").is_file():
        files.append(("tokenizer_config.json", (source / "tokenizer_config.json").read_bytes()))
    files.append((GENERATION, json.dumps(_generation_defaults(source), sort_keys=True).encode()))
    files.append(("sample.txt", sample.encode()))
    files.append(("accuracy.json", json.dumps(accuracy, sort_keys=True, indent=1).encode()))
    return files


def _generation_defaults(source: Path) -> dict[str, Any]:
    """generation_config.json's sampling fields the runtime understands, checked."""
    path = source / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"{path}: not readable JSON ({exc})") from exc
    defaults = {k: data[k] for k in GENERATION_KEYS if isinstance(data, dict) and data.get(k) is not None}
    try:
        SamplingOptions.from_dict(defaults)
    except (TypeError, ValueError) as exc:
        raise InvalidModelError(f"{path}: {exc}") from exc
    return defaults


def _write(dst: Path, files: list[tuple[str, bytes]], metadata: dict[str, Any]) -> None:
    inputs = [{"name": "input_ids", "dtype": "int64", "shape": ["tokens"]}]
    outputs = [{"name": "logits", "dtype": "float32", "shape": ["tokens", metadata["llm"]["vocab_size"]]}]
    manifest = Manifest.listing(files, inputs=inputs, outputs=outputs, metadata=metadata)
    manifest = dataclasses.replace(manifest, graph=INDEX)
    try:
        write_archive(dst, [(MANIFEST, manifest.to_bytes()), *files])
    except OSError as exc:
        raise ConversionError(f"{dst}: cannot write the package ({exc.strerror or exc})") from exc
    finally:
        Path(str(dst) + ".tmp").unlink(missing_ok=True)


def _parameters(checkpoint: Checkpoint) -> int:
    return sum(int(t.size) for t in checkpoint.tensors.values())
