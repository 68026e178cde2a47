"""`ferry convert model.onnx -o model.ferry [--quantize fp16|int8|int4]`: the converter from a shell.

`ferry convert-llm <checkpoint dir> --weights fp16|int8|int4 [--block 32|64]` and
`ferry convert-lora <adapter dir> --base <LLM package>`: converter/llm/cli.py."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from converter.convert import ConversionReport, convert
from converter.diffusion.cli import add_diffusion_parser, run_convert_diffusion
from converter.errors import ConversionError
from converter.llm.cli import add_llm_parser, run_convert_llm, run_convert_lora
from converter.options import ACTIVATION_METHODS, DEFAULT_BLOCK_SIZE, PRECISIONS, ConversionOptions


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description="Ferry model tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    conv = commands.add_parser("convert", help="convert an ONNX model into a Ferry package")
    conv.add_argument("source", type=Path, help="the .onnx model")
    conv.add_argument("-o", "--output", type=Path, help="the package to write (default: SOURCE with .ferry)")
    conv.add_argument(
        "--quantize",
        choices=PRECISIONS,
        help="weight storage precision (default: float32)",
    )
    conv.add_argument(
        "--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="int4 block size: 32, 64 or 128"
    )
    conv.add_argument(
        "--calibration", type=Path, help="an .npz with one array per model input, for the accuracy report"
    )
    conv.add_argument(
        "--activations",
        choices=ACTIVATION_METHODS,
        help="also quantize activations to int8: minmax or percentile (static, ranges from --calibration "
        "by this method) or dynamic (ranges computed per run, no calibration needed)",
    )
    conv.add_argument(
        "--keep-float",
        help="layers to keep float32: 'first_last' or comma-separated node names",
    )
    conv.add_argument(
        "--accuracy-budget",
        type=float,
        help="minimum cosine similarity of every output vs float32; the worst layers stay float32 to meet it",
    )
    conv.add_argument("--json", action="store_true", help="print the report as JSON")
    add_llm_parser(commands)
    add_diffusion_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed its usage message
        return int(exc.code or 0)
    if args.command == "convert-llm":
        return run_convert_llm(args)
    if args.command == "convert-diffusion":
        return run_convert_diffusion(args)
    if args.command == "convert-lora":
        return run_convert_lora(args)
    return _convert(args)


def _convert(args: argparse.Namespace) -> int:
    out, err = Console(), Console(stderr=True)
    dst = args.output or args.source.with_suffix(".ferry")
    try:
        columns = (TextColumn("{task.description}"), BarColumn())
        options = ConversionOptions.from_dict(
            {
                "quantize": args.quantize,
                "block_size": args.block_size,
                "calibration": args.calibration,
                "keep_float": args.keep_float,  # 'first_last' or comma-separated names
                "accuracy_budget": args.accuracy_budget,
                "activations": args.activations,
            }
        )
        with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
            task = bar.add_task("converting", total=1.0)
            report = convert(
                args.source,
                dst,
                options=options,
                progress=lambda fraction, message: bar.update(task, completed=fraction, description=message),
            )
    except ConversionError as exc:
        err.print(f"[bold red]error:[/] {_one_line(exc)}", highlight=False, soft_wrap=True)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        out.print(_table(report, dst))
    return 0


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _table(report: ConversionReport, dst: Path) -> Table:
    table = Table(title=f"{report.source} -> {dst}", show_header=False)
    rows = [
        (
            "source",
            f"{report.source_size:,} bytes, opset {report.source_opset}, sha256 {report.source_sha256[:16]}…",
        ),
        (
            "package",
            f"{report.package_size:,} bytes, opset {report.opset}, weights {report.weights_bytes:,} bytes",
        ),
        ("nodes", f"{report.nodes_before} -> {report.nodes_after}"),
        ("inputs", ", ".join(f"{s['name']} {s['dtype']}{s['shape']}" for s in report.inputs)),
        ("outputs", ", ".join(f"{s['name']} {s['dtype']}{s['shape']}" for s in report.outputs)),
        ("quantize", report.quantize or "none (float32)"),
    ]
    if report.fp16_max_abs_error is not None:
        rows.append(
            (
                "fp16 accuracy",
                f"max abs error {report.fp16_max_abs_error:.3g}, cosine {report.fp16_cosine_similarity:.6f}",
            )
        )
    if report.size_ratio is not None and report.quantize:
        rows.append(
            ("size vs float32", f"{report.size_ratio:.1%} ({report.fp32_package_size:,} bytes before)")
        )
    if report.activations:
        count = len(report.activation_inputs)
        how = "ranges per run" if report.activations == "dynamic" else f"{report.activations} ranges"
        rows.append(("int8 activations", f"{count} ({how})"))
    if report.float_layers:
        rows.append(("kept float32", ", ".join(report.float_layers)))
    if report.accuracy:
        source = f"{report.accuracy['samples']} {report.accuracy['inputs']} input(s)"
        for name, figures in report.accuracy["outputs"].items():
            top1 = figures["top1_agreement"]
            rows.append(
                (
                    f"accuracy {name}",
                    f"max abs {figures['max_abs_error']:.3g}, mean abs {figures['mean_abs_error']:.3g}, "
                    f"cosine {figures['cosine_similarity']:.6f}"
                    + (f", top-1 agreement {top1:.1%}" if top1 is not None else "")
                    + f" ({source})",
                )
            )
    for name, value in rows:
        table.add_row(name, value)
    return table


if __name__ == "__main__":
    sys.exit(main())
