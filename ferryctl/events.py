"""events and webhooks: the organisation's event feed, followed live, and where it is sent."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from ferryctl.output import field, out, show_record, show_rows
from ferryctl.session import JsonOption, LimitOption, connect
from ferryctl.stream import follow

webhooks = typer.Typer(help="Webhooks: the event feed POSTed to your URL, signed.", no_args_is_help=True)

EVENT_COLUMNS = [
    ("ID", field("id")),
    ("AT", field("at")),
    ("TYPE", field("type")),
    ("RELEASE", lambda e: e.get("release_name") or "-"),  # bulk device actions have none
    ("ACTOR", lambda e: e.get("actor") or "system"),
    ("REASON", field("reason")),
]
WEBHOOK_COLUMNS = [
    ("ID", field("id")),
    ("URL", field("url")),
    ("TYPES", lambda w: w.get("event_types") or "all"),
    ("ACTIVE", field("active")),
    ("DESCRIPTION", field("description")),
]
DELIVERY_COLUMNS = [
    ("ID", field("id")),
    ("EVENT", field("event_id")),
    ("TYPE", field("event_type")),
    ("STATE", field("state")),
    ("ATTEMPTS", field("attempts")),
    ("LAST", lambda d: d.get("last_status_code") or d.get("last_error") or "-"),
    ("CREATED", field("created_at")),
]
TypeOption = Annotated[
    list[str] | None,
    typer.Option("--type", help="Only this event type (release.aborted, ...), repeatable."),
]


def _line(event: dict) -> str:
    who = event.get("actor") or "system"
    reason = f": {event['reason']}" if event.get("reason") else ""
    return f"{event.get('at')}  {event.get('type'):<20} {event.get('release_name') or '-'}  ({who}){reason}"


def events_list(
    release: Annotated[str | None, typer.Option(help="Only this release's events.")] = None,
    type_: TypeOption = None,
    actor: Annotated[str | None, typer.Option(help="Only this user's actions ('' : the system's).")] = None,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing events as they happen (the SSE stream).")
    ] = False,
    timeout: Annotated[float | None, typer.Option(help="--follow: stop after this many seconds.")] = None,
    count: Annotated[int | None, typer.Option(min=1, help="--follow: stop after this many events.")] = None,
    after_id: Annotated[
        int | None, typer.Option(min=0, help="--follow: start after this event id (resume a script).")
    ] = None,
    as_json: JsonOption = False,
    limit: LimitOption = None,
) -> None:
    """The newest events (a table, or --json), or with --follow each event as it happens
    (--json: one JSON object per line)."""
    params = {"release": release, "type": type_, "actor": actor}
    ferry = connect()
    if not follow_:
        show_rows(list(ferry.pages("/audit/", params, limit)), EVENT_COLUMNS, as_json)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    resume = None if after_id is None else str(after_id)
    for seen, event in enumerate(follow(ferry, params, deadline=deadline, last_event_id=resume), start=1):
        if as_json:
            print(json.dumps(event, sort_keys=True), flush=True)
        else:
            out.print(_line(event), markup=False)
        if count is not None and seen >= count:
            break


@webhooks.command("list")
def webhooks_list(as_json: JsonOption = False, limit: LimitOption = None) -> None:
    """The organisation's webhooks (admins only)."""
    show_rows(list(connect().pages("/webhooks/", limit=limit)), WEBHOOK_COLUMNS, as_json)


@webhooks.command("create")
def webhooks_create(
    url: Annotated[str, typer.Argument(help="Where to POST events, e.g. https://ci.example.com/ferry.")],
    type_: TypeOption = None,
    description: Annotated[str, typer.Option(help="For people: what listens there.")] = "",
    as_json: JsonOption = False,
) -> None:
    """Subscribe a URL to events; prints the signing secret, which is shown only this once."""
    body = {"url": url, "event_types": type_ or [], "description": description}
    created = connect().create("/webhooks/", body)
    show_record(created, [*WEBHOOK_COLUMNS, ("SECRET", field("secret"))], as_json)


@webhooks.command("delete")
def webhooks_delete(webhook: Annotated[str, typer.Argument(help="The webhook's id.")]) -> None:
    """Unsubscribe: nothing more is sent."""
    connect().delete(f"/webhooks/{webhook}/")
    out.print(f"Deleted webhook {webhook}")


@webhooks.command("deliveries")
def webhooks_deliveries(
    webhook: Annotated[str, typer.Argument(help="The webhook's id.")],
    state: Annotated[str | None, typer.Option(help="pending, succeeded or failed.")] = None,
    as_json: JsonOption = False,
    limit: LimitOption = None,
) -> None:
    """The webhook's delivery log, newest first."""
    rows = list(connect().pages(f"/webhooks/{webhook}/deliveries/", {"state": state}, limit))
    show_rows(rows, DELIVERY_COLUMNS, as_json)


@webhooks.command("redeliver")
def webhooks_redeliver(
    webhook: Annotated[str, typer.Argument(help="The webhook's id.")],
    delivery: Annotated[str, typer.Argument(help="The delivery to send again.")],
    as_json: JsonOption = False,
) -> None:
    """Send a delivery's event again (a new delivery)."""
    show_record(
        connect().post(f"/webhooks/{webhook}/deliveries/{delivery}/redeliver/"), DELIVERY_COLUMNS, as_json
    )
