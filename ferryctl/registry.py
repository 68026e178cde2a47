"""models and versions: create models, upload ONNX files and wait for their conversion."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from ferryctl.client import Ferry, ReadProgress
from ferryctl.output import err, field, out, show_record, show_rows
from ferryctl.session import JsonOption, LimitOption, connect

models = typer.Typer(help="Models: named lines of versions.", no_args_is_help=True)
versions = typer.Typer(
    help="Versions: uploaded ONNX files and their converted packages.", no_args_is_help=True
)

MODEL_COLUMNS = [
    ("ID", field("id")),
    ("NAME", field("name")),
    ("VERSIONS", lambda m: len(m.get("versions") or [])),
    ("CREATED", field("created_at")),
]
VERSION_COLUMNS = [
    ("ID", field("id")),
    ("MODEL", field("model")),
    ("LABEL", field("label")),
    ("STATUS", field("status")),
    ("RELEASED", field("released")),
    ("SIZE", field("package_size")),
    ("CREATED", field("created_at")),
]
VERSION_DETAIL = [
    *VERSION_COLUMNS,
    ("SHA256", field("package_sha256")),
    ("JOB", lambda v: (v.get("job") or {}).get("status")),
    ("ERROR", lambda v: (v.get("job") or {}).get("error") or None),
]
SETTLED = ("ready", "failed")


@models.command("list")
def models_list(as_json: JsonOption = False, limit: LimitOption = None) -> None:
    """List the organisation's models."""
    rows = list(connect().pages("/models/", limit=limit))
    show_rows(rows, MODEL_COLUMNS, as_json)


@models.command("create")
def models_create(
    name: Annotated[str, typer.Argument(help="Letters, digits, '.', '_' or '-'.")],
    description: Annotated[str, typer.Option(help="What the model does.")] = "",
    as_json: JsonOption = False,
) -> None:
    """Create a model."""
    model = connect().create("/models/", {"name": name, "description": description})
    show_record(model, MODEL_COLUMNS, as_json)


def model_id(ferry: Ferry, model: str) -> int:
    """A model given by id or by name."""
    if model.isdigit():
        return int(model)
    for row in ferry.pages("/models/"):
        if row["name"] == model:
            return int(row["id"])
    raise typer.BadParameter(f"no model named {model!r} (see `ferryctl models list`)", param_hint="MODEL")


def _upload(ferry: Ferry, model: int, file: Path, label: str, options: dict, quiet: bool) -> dict:
    size = file.stat().st_size
    with (
        file.open("rb") as raw,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=err,
            disable=quiet,
            transient=True,
        ) as progress,
    ):
        task = progress.add_task(f"uploading {file.name}", total=size)
        reader = ReadProgress(raw, lambda n: progress.advance(task, n))
        data = {"label": label, **{k: str(v) for k, v in options.items() if v is not None}}
        return ferry.create(f"/models/{model}/versions/", files={"file": (file.name, reader)}, data=data)


def wait_converted(ferry: Ferry, version: dict, interval: float, timeout: float, quiet: bool) -> dict:
    """Poll the version until its conversion settles, showing the job's status."""
    deadline = time.monotonic() + timeout
    with err.status("converting", spinner="dots") as status:
        while version["status"] not in SETTLED:
            if time.monotonic() > deadline:
                raise typer.Exit(_timed_out(version, timeout))
            job = version.get("job") or {}
            if not quiet:
                status.update(f"converting: {job.get('status')} {round(100 * (job.get('progress') or 0))}%")
            time.sleep(interval)
            version = ferry.get(f"/versions/{version['id']}/")
    return version


def _timed_out(version: dict, timeout: float) -> int:
    err.print(f"error: version {version['id']} still {version['status']} after {timeout:g} s")
    return 1


@versions.command("upload")
def versions_upload(
    model: Annotated[str, typer.Argument(help="The model's id or name.")],
    file: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, readable=True, help="An ONNX file, or a tar/zip of a checkpoint."
        ),
    ],
    label: Annotated[str, typer.Option(help="The version's label, e.g. v1.2.")],
    quantize: Annotated[str | None, typer.Option(help="Weight precision (e.g. int8, int4).")] = None,
    kind: Annotated[
        str | None, typer.Option(help="onnx (default), llm, diffusion or llm_adapter (a PEFT tar/zip).")
    ] = None,
    base: Annotated[
        str | None, typer.Option(help="With --kind llm_adapter: the id of the llm version it was trained on.")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the conversion is done.")] = False,
    timeout: Annotated[float, typer.Option(help="--wait gives up after this many seconds.")] = 1800,
    interval: Annotated[float, typer.Option(help="--wait polls this often (seconds).")] = 1.0,
    as_json: JsonOption = False,
) -> None:
    """Upload a model as a new version; the server converts it into a package."""
    ferry = connect()
    options = {"quantize": quantize, "kind": kind, "base": base}
    version = _upload(ferry, model_id(ferry, model), file, label, options, as_json)
    if wait:
        version = wait_converted(ferry, version, interval, timeout, as_json)
    show_record(version, VERSION_DETAIL, as_json)
    if version["status"] == "failed":
        raise typer.Exit(1)


@versions.command("list")
def versions_list(
    model: Annotated[str | None, typer.Option(help="Only this model's (id or name).")] = None,
    status: Annotated[str | None, typer.Option(help="converting, ready or failed.")] = None,
    as_json: JsonOption = False,
    limit: LimitOption = None,
) -> None:
    """List versions, newest first."""
    ferry = connect()
    params = {"model": model_id(ferry, model) if model else None, "status": status}
    show_rows(list(ferry.pages("/versions/", params, limit)), VERSION_COLUMNS, as_json)


@versions.command("show")
def versions_show(
    version: Annotated[str, typer.Argument(help="The version's id.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the conversion is done.")] = False,
    timeout: Annotated[float, typer.Option(help="--wait gives up after this many seconds.")] = 1800,
    as_json: JsonOption = False,
) -> None:
    """A version, its package and its conversion job."""
    ferry = connect()
    found = ferry.get(f"/versions/{version}/")
    if wait:
        found = wait_converted(ferry, found, 1.0, timeout, as_json)
    show_record(found, VERSION_DETAIL, as_json)
    if as_json:
        return
    for line in (found.get("job") or {}).get("log") or []:
        out.print(f"  {line}")
