"""releases: create, inspect, watch and steer rollouts."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Annotated

import typer
from rich.live import Live

from ferryctl.client import Ferry
from ferryctl.output import emit_json, err, field, out, show_record, show_rows, table
from ferryctl.session import JsonOption, LimitOption, connect, parse_pairs
from ferryctl.stream import follow

releases = typer.Typer(help="Releases: a version rolled out to a target, in phases.", no_args_is_help=True)

RELEASE_COLUMNS = [
    ("ID", field("id")),
    ("NAME", field("name")),
    ("STATE", field("state")),
    ("VERSION", lambda r: _version_name(r)),
    ("PHASE", lambda r: f"{r.get('phase')}/{len(r.get('phases') or [])} ({r.get('percentage')}%)"),
    ("CREATED", field("created_at")),
]
RELEASE_DETAIL = [
    *RELEASE_COLUMNS,
    ("REVISION", field("revision")),
    ("TARGET", field("target")),
    ("DEVICES", lambda r: {k: v for k, v in (r.get("devices") or {}).items() if k != "by_state"}),
    ("BY STATE", lambda r: (r.get("devices") or {}).get("by_state")),
    ("GATE", field("gate_status")),
]
DEVICE_COLUMNS = [
    ("DEVICE", field("device_name")),
    ("ID", field("device_id")),
    ("STATE", field("state")),
    ("REASON", field("reason_code")),
    ("MESSAGE", field("message")),
    ("SINCE", field("reported_at")),
]
EVENT_COLUMNS = [
    ("AT", field("at")),
    ("TYPE", field("type")),
    ("ACTION", field("action")),
    ("ACTOR", field("actor")),
    ("REASON", field("reason")),
]
FINISHED = ("completed", "aborted", "rolled_back")
ReasonOption = Annotated[str, typer.Option(help="Why: kept in the release's history.")]


def _version_name(release: dict) -> str:
    info = release.get("version_info") or {}
    named = " ".join(str(info[k]) for k in ("model", "label") if info.get(k))
    return named or str(release.get("version"))


@releases.command("create")
def releases_create(
    name: Annotated[str, typer.Argument(help="A name people will recognise.")],
    version: Annotated[str, typer.Option(help="The version id to roll out.")],
    filter_: Annotated[
        str | None, typer.Option("--filter", help="Devices matching this filter, e.g. 'labels.site == lab'.")
    ] = None,
    labels: Annotated[
        list[str] | None, typer.Option(help="Devices with this label (key=value), repeatable.")
    ] = None,
    group: Annotated[list[str] | None, typer.Option(help="A device group (id or name), repeatable.")] = None,
    device: Annotated[list[str] | None, typer.Option(help="A device id, repeatable.")] = None,
    phases: Annotated[
        str | None, typer.Option(help="Phase percentages, comma-separated, e.g. 5,25,100.")
    ] = None,
    soak: Annotated[int, typer.Option(help="Minimum seconds in each phase before advancing.")] = 0,
    priority: Annotated[int, typer.Option(help="Higher wins when releases overlap.")] = 0,
    download_only: Annotated[bool, typer.Option("--download-only", help="Stage, activate later.")] = False,
    allow_empty: Annotated[
        bool, typer.Option("--allow-empty", help="Create even if no device matches yet.")
    ] = False,
    start: Annotated[bool, typer.Option("--start", help="Start it at once (default: a draft).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Create a release (a draft unless --start)."""
    target: dict = {}
    if filter_:
        target["filter"] = filter_
    if labels:
        target["labels"] = parse_pairs(labels, "--labels")
    ferry = connect()
    if group:
        target["group_ids"] = [_group_id(ferry, g) for g in group]
    if device:
        target["device_ids"] = device
    body = {
        "name": name,
        "version": version,
        "target": target,
        "phases": _phases(phases, soak),
        "priority": priority,
        "download_only": download_only,
        "allow_empty": allow_empty,
        "start": start,
    }
    show_record(ferry.create("/releases/", body), RELEASE_DETAIL, as_json)


def _group_id(ferry: Ferry, group: str) -> str:
    """A device group given by id or by name."""
    try:
        return str(uuid.UUID(group))
    except ValueError:
        pass
    for row in ferry.pages("/device-groups/"):
        if row["name"] == group:
            return row["id"]
    raise typer.BadParameter(f"no device group named {group!r}", param_hint="--group")


def _phases(spec: str | None, soak: int) -> list[dict]:
    if not spec:
        return []
    try:
        percentages = [float(p) for p in spec.split(",") if p.strip()]
    except ValueError as exc:
        raise typer.BadParameter(
            f"{spec!r} is not a list of numbers like 5,25,100", param_hint="--phases"
        ) from exc
    return [{"percentage": p, "min_soak_seconds": soak} for p in percentages]


@releases.command("list")
def releases_list(
    state: Annotated[list[str] | None, typer.Option(help="Only releases in this state, repeatable.")] = None,
    version: Annotated[str | None, typer.Option(help="Only releases of this version id.")] = None,
    as_json: JsonOption = False,
    limit: LimitOption = None,
) -> None:
    """List releases, newest first."""
    rows = list(connect().pages("/releases/", {"state": state, "version": version}, limit))
    show_rows(rows, RELEASE_COLUMNS, as_json)


@releases.command("show")
def releases_show(
    release: Annotated[str, typer.Argument(help="The release's id.")],
    as_json: JsonOption = False,
) -> None:
    """A release: its state, phases, device counts and history."""
    found = connect().get(f"/releases/{release}/")
    show_record(found, RELEASE_DETAIL, as_json)
    if not as_json and found.get("events"):
        out.print(table(found["events"], EVENT_COLUMNS, title="History"))


def _snapshot(ferry: Ferry, release: str) -> tuple[dict, list[dict]]:
    return ferry.get(f"/releases/{release}/"), list(ferry.pages(f"/releases/{release}/devices/"))


def _render(found: dict, devices: list[dict]):
    counts = (found.get("devices") or {}).get("by_state") or {}
    title = f"{found['name']}: {found['state']}, phase {found.get('phase')} · " + (
        ", ".join(f"{k} {v}" for k, v in counts.items()) or "no devices yet"
    )
    return table(devices, DEVICE_COLUMNS, title=title)


@releases.command("watch")
def releases_watch(
    release: Annotated[str, typer.Argument(help="The release's id.")],
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 2.0,
    timeout: Annotated[float | None, typer.Option(help="Stop watching after this many seconds.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Follow a release device by device until it completes, is aborted or rolled back.

    Exits 0 when completed, 1 when aborted or rolled back, 3 on --timeout."""
    ferry = connect()
    deadline = None if timeout is None else time.monotonic() + timeout
    found, devices = _snapshot(ferry, release)
    wake = _wake_on_events(release)
    with Live(_render(found, devices), console=err if as_json else out, auto_refresh=False) as live:
        while found["state"] not in FINISHED:
            if deadline is not None and time.monotonic() > deadline:
                break
            wait = interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
            if wake.wait(wait):  # an event of the release (a state change, a refusal): refresh now
                wake.clear()
            found, devices = _snapshot(ferry, release)
            live.update(_render(found, devices), refresh=True)
    if as_json:
        emit_json({"release": found, "devices": devices})
    if found["state"] not in FINISHED:
        err.print(f"still {found['state']} after {timeout:g} s")
        raise typer.Exit(3)
    raise typer.Exit(0 if found["state"] == "completed" else 1)


def _wake_on_events(release: str) -> threading.Event:
    """Set whenever the server's event stream reports something of the release, so a state change
    or a refusal shows at once; per-device progress is not an event, the polling shows it. With
    no stream (an older server, a refusal), the event is never set and polling does it all."""
    wake = threading.Event()

    def listen() -> None:
        ferry = connect()
        try:
            for _ in follow(ferry, {"release": release}):
                wake.set()
        except Exception:  # noqa: BLE001 - the stream only hurries the refresh along
            return
        finally:
            ferry.close()

    threading.Thread(target=listen, name="release-events", daemon=True).start()
    return wake


def _act(release: str, action: str, reason: str, expected_revision: int | None, as_json: bool) -> None:
    body: dict = {"reason": reason}
    if expected_revision is not None:
        body["expected_revision"] = expected_revision
    show_record(connect().post(f"/releases/{release}/{action}/", body), RELEASE_DETAIL, as_json)


RevisionOption = Annotated[
    int | None, typer.Option(help="The revision you saw: refused (409) if the release moved since.")
]


def _action_command(action: str, doc: str) -> None:
    def command(
        release: Annotated[str, typer.Argument(help="The release's id.")],
        reason: ReasonOption = "",
        expected_revision: RevisionOption = None,
        as_json: JsonOption = False,
    ) -> None:
        _act(release, action, reason, expected_revision, as_json)

    command.__doc__ = doc
    releases.command(action)(command)


for _action, _doc in (
    ("start", "Start a draft release."),
    ("pause", "Pause a release: devices keep what they have, no new ones are selected."),
    ("resume", "Resume a paused release."),
    ("advance", "Move to the next phase now."),
    ("abort", "Stop a release: devices keep what they run now."),
    ("rollback", "Stop a release and send its devices back to their previous version."),
):
    _action_command(_action, _doc)
