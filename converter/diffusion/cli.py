"""`ferry convert-diffusion <layout dir> [-o out.ferry] --weights fp32|fp16|int8 [--size 512]
[--min-size N] [--max-size N] [--size-multiple 8] [--steps 20] [--scheduler dpmpp_2m]
[--accuracy-steps 20] [--json]`: diffusers' / optimum's ONNX layout into a diffusion package."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from converter.diffusion.convert import (
    PRECISIONS,
    DiffusionConversionReport,
    DiffusionOptions,
    convert_diffusion,
)
from converter.errors import ConversionError
from engine.diffusion.schedulers import DEFAULT, NAMES


def add_diffusion_parser(commands: Any) -> None:
    p = commands.add_parser("convert-diffusion", help="convert a diffusers/optimum ONNX text-to-image layout")
    p.add_argument(
        "source", type=Path, help="the layout (text_encoder/, unet/, vae_decoder/, tokenizer/, scheduler/)"
    )
    p.add_argument("-o", "--output", type=Path, help="the package to write (default: SOURCE-WEIGHTS.ferry)")
    p.add_argument("--weights", choices=PRECISIONS, default="fp32", help="weight precision (default: fp32)")
    p.add_argument("--size", type=int, default=512, help="default image size, square (default: 512)")
    p.add_argument("--min-size", type=int, help="smallest side a request may ask for (default: size/2)")
    p.add_argument("--max-size", type=int, help="largest side a request may ask for (default: 1.5 x size)")
    p.add_argument(
        "--size-multiple", type=int, default=8, help="sides must be multiples of this (default: 8)"
    )
    p.add_argument("--steps", type=int, default=20, help="default denoising steps (default: 20)")
    p.add_argument(
        "--scheduler", choices=NAMES, default=DEFAULT, help=f"default sampler (default: {DEFAULT})"
    )
    p.add_argument("--accuracy-steps", type=int, default=20, help="steps of the image compared with fp32")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_convert_diffusion(args: argparse.Namespace) -> int:
    out, err = Console(), Console(stderr=True)
    dst = args.output or args.source.parent / f"{args.source.name}-{args.weights}.ferry"
    try:
        options = DiffusionOptions(
            weights=args.weights,
            size=args.size,
            min_size=args.min_size,
            max_size=args.max_size,
            size_multiple=args.size_multiple,
            steps=args.steps,
            scheduler=args.scheduler,
            accuracy_steps=args.accuracy_steps,
        )
        report = convert_diffusion(args.source, dst, options=options)
    except ConversionError as exc:
        err.print(f"[bold red]error:[/] {' '.join(str(exc).split())}", highlight=False, soft_wrap=True)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        out.print(_table(report, dst))
    return 0


def _table(report: DiffusionConversionReport, dst: Path) -> Table:
    table = Table(title=f"{report.source} -> {dst}", show_header=False)
    table.add_row(
        "weights",
        f"{report.precision}: graphs {report.converted_size:,} bytes ({report.size_ratio:.1%} of fp32)",
    )
    for name, graph in report.graphs.items():
        line = f"{graph['nodes_before']} -> {graph['nodes_after']} nodes"
        outputs = (graph.get("accuracy") or {}).get("outputs", {})
        for output, figures in list(outputs.items())[:1]:
            cosine, worst = figures["cosine_similarity"], figures["max_abs_error"]
            line += f", {output} cosine {cosine:.6f}, max abs {worst:.3g}"
        table.add_row(name, line)
    if report.pipeline:
        p = report.pipeline
        table.add_row(
            "image vs fp32",
            f"PSNR {p['psnr_db']:.2f} dB, SSIM {p['ssim']:.4f} "
            f"({p['steps']} steps, {p['size']}px, seed {p['seed']})",
        )
    table.add_row("package", f"{report.package_size:,} bytes in {report.seconds:.1f} s")
    return table
