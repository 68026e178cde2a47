"""The source layout diffusers' ONNX export and optimum write, read and checked before converting:

    text_encoder/model.onnx   unet/model.onnx   vae_decoder/model.onnx (+ config.json)
    tokenizer/ (tokenizer.json, or vocab.json + merges.txt; tokenizer_config.json)
    scheduler/scheduler_config.json

Everything missing is named at once; then the graphs must agree with each other: the UNet's
``encoder_hidden_states`` width is the text encoder's output width, its latent channels are the
VAE decoder's, the tokenizer's ids fit the token embedding, and the UNet takes no conditioning
this pipeline does not supply (SDXL's ``text_embeds``/``time_ids``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from converter.errors import InvalidModelError
from engine.diffusion.errors import DiffusionError
from engine.diffusion.schedule import ScheduleConfig
from engine.diffusion.tokenizer import ClipTokenizer

GRAPH_FILES = {
    "text_encoder": "text_encoder/model.onnx",
    "unet": "unet/model.onnx",
    "vae_decoder": "vae_decoder/model.onnx",
}
UNET_INPUTS = ("sample", "timestep", "encoder_hidden_states")
DEFAULT_SCALING = 0.18215  # Stable Diffusion 1.x/2.x's VAE latent scale


class DiffusionLayoutError(InvalidModelError):
    """The source directory is not a usable diffusion layout; names every file or field at fault."""


Dims = list[int | str]


@dataclass
class Layout:
    root: Path
    graphs: dict[str, Path]
    tokenizer: ClipTokenizer
    scheduler: dict[str, Any]
    text_width: int
    latent_channels: int
    scaling_factor: float
    vae_scale_factor: int


def _dims(value: onnx.ValueInfoProto) -> Dims:
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
        for d in value.type.tensor_type.shape.dim
    ]


def _signature(path: Path) -> tuple[dict[str, Dims], dict[str, Dims], onnx.GraphProto]:
    """Inputs and outputs of a graph (weights in external files are not read)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise DiffusionLayoutError(f"{path}: not a readable ONNX model ({exc})") from exc
    inits = {t.name for t in model.graph.initializer}
    inputs = {v.name: _dims(v) for v in model.graph.input if v.name not in inits}
    return inputs, {v.name: _dims(v) for v in model.graph.output}, model.graph


def _missing(root: Path) -> list[str]:
    missing = [rel for rel in GRAPH_FILES.values() if not (root / rel).is_file()]
    tok = root / "tokenizer"
    if not (tok / "tokenizer.json").is_file() and not (
        (tok / "vocab.json").is_file() and (tok / "merges.txt").is_file()
    ):
        missing.append("tokenizer/ (tokenizer.json, or vocab.json and merges.txt)")
    if not (root / "scheduler" / "scheduler_config.json").is_file():
        missing.append("scheduler/scheduler_config.json")
    return missing


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DiffusionLayoutError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise DiffusionLayoutError(f"{path}: must hold a JSON object")
    return data


def _embedding_rows(graph: onnx.GraphProto, ids_name: str) -> int | None:
    """Rows of the token embedding: the initializer a Gather indexes with the ids (maybe cast)."""
    names = {ids_name}
    for node in graph.node:
        if node.op_type == "Cast" and node.input[0] in names:
            names.add(node.output[0])
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in names:
            dims = shapes.get(node.input[0])
            return int(dims[0]) if dims else None
    return None


def read_layout(source: str | Path) -> Layout:
    """The checked layout under ``source``, or DiffusionLayoutError naming what is wrong."""
    root = Path(source)
    if not root.is_dir():
        raise DiffusionLayoutError(f"{root}: not a directory (the diffusers/optimum ONNX layout)")
    missing = _missing(root)
    if missing:
        raise DiffusionLayoutError(f"{root}: missing {', '.join(missing)}")
    scheduler = _json(root / "scheduler" / "scheduler_config.json")
    try:
        ScheduleConfig.from_dict(scheduler)
        tokenizer = ClipTokenizer.from_directory(root / "tokenizer")
    except DiffusionError as exc:
        raise DiffusionLayoutError(f"{root}: {exc}") from exc
    text_in, text_out, text_graph = _signature(root / GRAPH_FILES["text_encoder"])
    unet_in, unet_out, _ = _signature(root / GRAPH_FILES["unet"])
    vae_in, vae_out, _ = _signature(root / GRAPH_FILES["vae_decoder"])
    problems: list[str] = []
    text_width = _text_width(text_in, text_out, tokenizer, problems)
    rows = _embedding_rows(text_graph, next(iter(text_in), ""))
    if rows is not None and tokenizer.largest_id >= rows:
        problems.append(
            f"the tokenizer has token id {tokenizer.largest_id}, "
            f"past the text encoder's {rows} embedding rows"
        )
    latent = _check_unet(unet_in, unet_out, text_width, problems)
    vae_channels = next(iter(vae_in.values()), ["?", "?"])[1] if len(vae_in) == 1 else None
    if len(vae_in) != 1 or len(vae_out) != 1:
        problems.append(f"vae_decoder must take one latent input and give one image (has {list(vae_in)})")
    elif isinstance(latent, int) and isinstance(vae_channels, int) and vae_channels != latent:
        problems.append(f"the UNet's sample has {latent} channels but the VAE decoder takes {vae_channels}")
    if problems:
        raise DiffusionLayoutError(f"{root}: " + "; ".join(problems))
    vae_config = (
        _json(root / "vae_decoder" / "config.json")
        if (root / "vae_decoder" / "config.json").is_file()
        else {}
    )
    blocks = vae_config.get("block_out_channels")
    return Layout(
        root=root,
        graphs={name: root / rel for name, rel in GRAPH_FILES.items()},
        tokenizer=tokenizer,
        scheduler=scheduler,
        text_width=int(text_width),
        latent_channels=int(latent),
        scaling_factor=float(vae_config.get("scaling_factor", DEFAULT_SCALING)),
        vae_scale_factor=2 ** (len(blocks) - 1) if isinstance(blocks, list) and blocks else 8,
    )


def _text_width(
    inputs: dict[str, Dims], outputs: dict[str, Dims], tokenizer: ClipTokenizer, problems: list[str]
) -> int | None:
    if len(inputs) != 1:
        problems.append(f"text_encoder must take one input (the token ids), it takes {list(inputs)}")
        return None
    ids = next(iter(inputs.values()))
    if len(ids) != 2:
        problems.append(f"text_encoder's ids must be [batch, length], not {ids}")
    elif isinstance(ids[1], int) and ids[1] != tokenizer.max_length:
        tokenizer.max_length = ids[1]  # the graph's fixed length wins over tokenizer_config.json
    hidden = outputs.get("last_hidden_state", next(iter(outputs.values()), []))
    if len(hidden) != 3 or not isinstance(hidden[2], int):
        problems.append(f"text_encoder's last_hidden_state must be [batch, length, width], not {hidden}")
        return None
    return hidden[2]


def _check_unet(
    inputs: dict[str, Dims], outputs: dict[str, Dims], width: int | None, problems: list[str]
) -> int | None:
    absent = [n for n in UNET_INPUTS if n not in inputs]
    extra = [n for n in inputs if n not in UNET_INPUTS]
    if absent:
        problems.append(f"the UNet lacks the inputs {absent} (it has {list(inputs)})")
    if extra:
        problems.append(f"the UNet takes {extra}, conditioning this pipeline does not supply (SDXL?)")
    if absent:
        return None
    context = inputs["encoder_hidden_states"]
    if len(context) == 3 and width is not None and isinstance(context[2], int) and context[2] != width:
        problems.append(
            f"the UNet's encoder_hidden_states width is {context[2]} but the text encoder's output is {width}"
        )
    sample = inputs["sample"]
    if len(sample) != 4 or not isinstance(sample[1], int):
        problems.append(
            f"the UNet's sample must be [batch, channels, height, width] with fixed channels, not {sample}"
        )
        return None
    out = next(iter(outputs.values()), [])
    if len(outputs) != 1 or (len(out) == 4 and isinstance(out[1], int) and out[1] != sample[1]):
        problems.append(f"the UNet must give one output of the sample's {sample[1]} channels")
    return sample[1]
