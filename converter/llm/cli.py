"""`ferry convert-llm <checkpoint dir> [-o out.ferry] --weights fp32|fp16|int8|int4 [--block 32|64]
[--text FILE] [--json]`: a Hugging Face Llama-family checkpoint into a Ferry LLM package.
`ferry convert-lora <adapter dir> --base <LLM package> [-o out.ferry] [--json]`: a PEFT LoRA
adapter into an adapter package bound to that base."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from converter.errors import ConversionError
from converter.llm.convert import BLOCKS, PRECISIONS, LlmConversionReport, convert_llm
from converter.llm.lora import convert_lora


def add_llm_parser(commands: Any) -> None:
    llm = commands.add_parser("convert-llm", help="convert a Hugging Face Llama/Qwen2/Mistral checkpoint")
    llm.add_argument(
        "source", type=Path, help="the checkpoint directory (config.json, *.safetensors, tokenizer)"
    )
    llm.add_argument("-o", "--output", type=Path, help="the package to write (default: SOURCE-WEIGHTS.ferry)")
    llm.add_argument("--weights", choices=PRECISIONS, default="int4", help="weight precision (default: int4)")
    llm.add_argument("--block", type=int, choices=BLOCKS, default=32, help="int4 block size (default: 32)")
    llm.add_argument("--text", type=Path, help="text for the accuracy report (default: the shipped sample)")
    llm.add_argument("--json", action="store_true", help="print the report as JSON")
    lora = commands.add_parser("convert-lora", help="convert a PEFT LoRA adapter for an LLM package")
    lora.add_argument(
        "source", type=Path, help="the adapter directory (adapter_config.json, adapter_model.safetensors)"
    )
    lora.add_argument("--base", type=Path, required=True, help="the base LLM package (.ferry or unpacked)")
    lora.add_argument("-o", "--output", type=Path, help="the adapter package (default: SOURCE.ferry)")
    lora.add_argument("--json", action="store_true", help="print the report as JSON")


def run_convert_lora(args: argparse.Namespace) -> int:
    source: Path = args.source
    dst = args.output or source.parent / f"{source.name}.ferry"
    try:
        report = convert_lora(source, args.base, dst)
    except ConversionError as exc:
        Console(stderr=True).print(
            f"[bold red]error:[/] {' '.join(str(exc).split())}", highlight=False, soft_wrap=True
        )
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        Console().print(
            f"{source} -> {dst}: rank {report.rank} on {', '.join(report.targets)}, "
            f"{report.package_size:,} bytes, bound to base {report.base_digest[:12]}",
            highlight=False,
        )
    return 0


def run_convert_llm(args: argparse.Namespace) -> int:
    out, err = Console(), Console(stderr=True)
    source: Path = args.source
    dst = args.output or source.parent / f"{source.name}-{args.weights}.ferry"
    try:
        report = convert_llm(source, dst, weights=args.weights, block=args.block, text=args.text)
    except ConversionError as exc:
        err.print(f"[bold red]error:[/] {' '.join(str(exc).split())}", highlight=False, soft_wrap=True)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        out.print(_table(report, dst))
    return 0


def _table(report: LlmConversionReport, dst: Path) -> Table:
    a = report.accuracy
    table = Table(title=f"{report.source} -> {dst}", show_header=False)
    block = f", block {report.block}" if report.precision == "int4" else ""
    rows = [
        ("model", f"{report.model_type}, {report.parameters:,} parameters"),
        (
            "weights",
            f"{report.precision}{block}: {report.weights_bytes:,} bytes ({report.checkpoint_bytes:,} before)",
        ),
        ("package", f"{report.package_size:,} bytes"),
        ("top-1 agreement", f"{a['top1_agreement']:.1%} vs fp32 over {a['tokens']} tokens"),
        ("mean KL", f"{a['mean_kl']:.4g} nats"),
        ("perplexity", f"{a['perplexity']:.4g} (fp32: {a['fp32_perplexity']:.4g})"),
        ("time", f"{report.seconds:.1f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
