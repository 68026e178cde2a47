"""devices and tokens: the fleet, pins, and the enrolment tokens devices join with."""

from __future__ import annotations

from typing import Annotated

import typer

from ferryctl.output import field, out, show_record, show_rows, table
from ferryctl.session import JsonOption, LimitOption, connect, parse_pairs

devices = typer.Typer(help="Devices: list, inspect, pin.", no_args_is_help=True)
tokens = typer.Typer(help="Enrolment tokens: one per device that joins.", no_args_is_help=True)


def _version(key: str):
    def get(row: dict) -> str | None:
        info = row.get(f"{key}_info") or {}
        return " ".join(str(info[k]) for k in ("model", "label") if info.get(k)) or row.get(key)

    return get


def _release_keys(row: dict) -> str | None:
    """The release-key rotation the device holds and how it stands, e.g. "2 current"."""
    if "release_key_sequence" not in row:  # an older control plane
        return None
    return f"{row['release_key_sequence']} {row.get('release_key_status', '')}".strip()


DEVICE_COLUMNS = [
    ("ID", field("id")),
    ("NAME", field("name")),
    ("LABELS", field("labels")),
    ("RUNNING", _version("running_version")),
    ("PINNED", _version("pinned_version")),
    ("LAST SEEN", field("last_seen_at")),
    ("KEYS", _release_keys),
]
DEVICE_DETAIL = [
    *DEVICE_COLUMNS,
    ("ATTRIBUTES", field("attributes")),
    ("ENROLLED", field("enrolled_at")),
    ("REVOKED", field("revoked_at")),
]
HISTORY_COLUMNS = [
    ("AT", field("created_at")),
    ("FROM", _version("from_version")),
    ("TO", _version("to_version")),
]
TOKEN_COLUMNS = [
    ("ID", field("id")),
    ("STATE", field("state")),
    ("LABELS", field("labels")),
    ("EXPIRES", field("expires_at")),
    ("USED", field("used_at")),
]


@devices.command("list")
def devices_list(
    filter_: Annotated[
        str | None, typer.Option("--filter", help="Ferry's filter language, e.g. 'labels.site == lab'.")
    ] = None,
    group: Annotated[str | None, typer.Option(help="Members of this device group id.")] = None,
    version: Annotated[str | None, typer.Option(help="Devices running this version id.")] = None,
    as_json: JsonOption = False,
    limit: LimitOption = None,
) -> None:
    """List devices."""
    params = {"filter": filter_, "group": group, "version": version}
    show_rows(list(connect().pages("/devices/", params, limit)), DEVICE_COLUMNS, as_json)


@devices.command("show")
def devices_show(
    device: Annotated[str, typer.Argument(help="The device's id.")], as_json: JsonOption = False
) -> None:
    """A device, what it runs and the versions it ran."""
    found = connect().get(f"/devices/{device}/")
    show_record(found, DEVICE_DETAIL, as_json)
    if not as_json and found.get("history"):
        out.print(table(found["history"], HISTORY_COLUMNS, title="History"))


@devices.command("pin")
def devices_pin(
    device: Annotated[str, typer.Argument(help="The device's id.")],
    version: Annotated[str, typer.Option(help="The version id it must run, whatever releases say.")],
    as_json: JsonOption = False,
) -> None:
    """Pin a device to a version."""
    show_record(connect().post(f"/devices/{device}/pin/", {"version": version}), DEVICE_COLUMNS, as_json)


@devices.command("unpin")
def devices_unpin(
    device: Annotated[str, typer.Argument(help="The device's id.")], as_json: JsonOption = False
) -> None:
    """Unpin a device: releases decide what it runs again."""
    show_record(connect().post(f"/devices/{device}/pin/", {"version": None}), DEVICE_COLUMNS, as_json)


@tokens.command("create")
def tokens_create(
    labels: Annotated[
        list[str] | None, typer.Option(help="Labels the device gets (key=value), repeatable.")
    ] = None,
    ttl_hours: Annotated[int, typer.Option(min=1, max=720, help="Valid for this many hours.")] = 24,
    as_json: JsonOption = False,
) -> None:
    """Create an enrolment token (shown once: give it to one device)."""
    body = {"labels": parse_pairs(labels, "--labels"), "ttl_hours": ttl_hours}
    created = connect().create("/enrolment-tokens/", body)
    columns = [
        *TOKEN_COLUMNS[:1],
        ("TOKEN", field("token")),
        ("BUNDLE", field("bundle")),
        *TOKEN_COLUMNS[2:4],
    ]
    show_record(created, columns, as_json)


@tokens.command("list")
def tokens_list(as_json: JsonOption = False, limit: LimitOption = None) -> None:
    """List enrolment tokens (their secrets are never shown again)."""
    show_rows(list(connect().pages("/enrolment-tokens/", limit=limit)), TOKEN_COLUMNS, as_json)


@tokens.command("revoke")
def tokens_revoke(
    token: Annotated[int, typer.Argument(help="The token's id.")], as_json: JsonOption = False
) -> None:
    """Revoke an unused enrolment token."""
    show_record(connect().post(f"/enrolment-tokens/{token}/revoke/") or {"id": token}, TOKEN_COLUMNS, as_json)
