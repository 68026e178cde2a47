"""How many devices stand where with a release, for its detail answer, at fleet scale.

The same figures as counting releases.selectors.release_device_statuses row by row (every
stored report, plus each selected device with none: running if it runs the release's version,
else pending), without building those rows: at 100,000 devices that list costs seconds.

- The stored reports by state are read on every call: on PostgreSQL from the counts its
  triggers keep (releases.models.ReleaseStateCount, a few rows), elsewhere counted.
- The selected devices without a report need the selection, which reads every matching
  device (seconds of CPU at 100,000). Their running/pending split is kept per release: the
  gate's evaluation of an active release, which computes the selection anyway, keeps it
  (release_split_keep, GATE_KEPT_SECONDS), so a request only reads it; a request that finds
  none (a paused or completed release, a gate not running) computes it and keeps it
  UNREPORTED_SECONDS. A kept split whose release's revision, phase, state or threshold has
  changed since is computed again at once. What else moves it (an enrolment or a revocation,
  an install by an agent that sends no status, attributes that move a device in or out of the
  target) is seen at the next gate evaluation, or within UNREPORTED_SECONDS, as the answer's
  ``matching`` is as of the last gate evaluation. A device that sent its first report since
  the split was kept leaves it at once (its stored row is counted; it is taken off pending,
  then running).
"""

from __future__ import annotations

from django.core.cache import cache
from django.db.models import CharField, F, QuerySet
from django.db.models.functions import Cast, Collate

from releases.models import DeviceReleaseStatus, Release
from releases.selectors import Selection, release_selection, release_state_counts

UNREPORTED_SECONDS = 30  # FERRY_GATE_INTERVAL_SECONDS' default: matching's own age
# three gate intervals: a tick that runs late does not hand the recompute back to a request
GATE_KEPT_SECONDS = 3 * UNREPORTED_SECONDS
SELECTING_STATES = ("active", "paused", "completed")  # the others select no device


def release_device_summary(*, release: Release, keep: bool = True) -> dict[str, int]:
    """{state: devices}: stored reports by state, plus the selected devices with none
    (``keep``: their split as kept, see above; False computes it now)."""
    stored = release_state_counts(release_ids=[release.pk])[str(release.pk)]
    summary = {state: n for state, n in stored.items() if n}
    if release.state not in SELECTING_STATES:
        return summary
    unreported = _unreported(release, reported=sum(stored.values()), keep=keep)
    for state in ("running", "pending"):
        if unreported[state]:
            summary[state] = summary.get(state, 0) + unreported[state]
    return summary


def release_split_keep(*, release: Release, selection: Selection) -> None:
    """Keep the release's running/pending split of selected devices without a report, from a
    selection just computed (the gate's), for GATE_KEPT_SECONDS."""
    entry = {**_unreported_from(release, selection), "fingerprint": _fingerprint(release)}
    cache.set(_key(release), entry, GATE_KEPT_SECONDS)


def _key(release: Release) -> str:
    return f"releases:unreported:{release.pk}"  # one entry per release, replaced when it moves


def _fingerprint(release: Release) -> str:
    return f"{release.revision}:{release.current_phase}:{release.state}:{release.bucket_threshold}"


def _unreported(release: Release, *, reported: int, keep: bool) -> dict[str, int]:
    """{"running", "pending"}: the selected devices without a stored report."""
    entry = cache.get(_key(release)) if keep else None
    if entry is None or entry.get("fingerprint") != _fingerprint(release):
        entry = {
            **_unreported_from(release, release_selection(release)),
            "fingerprint": _fingerprint(release),
        }
        cache.set(_key(release), entry, UNREPORTED_SECONDS)
    # reports that arrived since: each was (as good as always) a pending selected device's first
    new = max(0, reported - entry["reported"])
    pending = max(0, entry["pending"] - new)
    running = max(0, entry["running"] - (new - (entry["pending"] - pending)))
    return {"running": running, "pending": pending}


def _unreported_from(release: Release, selection: Selection) -> dict[str, int]:
    reported = {
        str(d)
        for d in DeviceReleaseStatus.objects.filter(release=release).values_list("device_id", flat=True)
    }
    missing = selection.selected - reported
    running = len(missing & selection.running)
    return {"running": running, "pending": len(missing) - running, "reported": len(reported)}


# States only a stored report gives: a device without one is running or pending.
REPORTED_ONLY_STATES = frozenset(DeviceReleaseStatus.State.values) - {"running", "pending"}


class StatusRows:
    """A query's rows as release_device_statuses' dicts; counted and sliced in the database
    (what LimitOffsetPagination asks of a list)."""

    def __init__(self, rows: QuerySet) -> None:
        self._rows = rows

    def count(self) -> int:
        return self._rows.count()

    def __getitem__(self, index: slice) -> list[dict]:
        return [_status_row(row) for row in self._rows[index]]

    def __iter__(self):
        return (_status_row(row) for row in self._rows)


def _status_row(row: dict) -> dict:
    return {"device_id": row.pop("device_key"), "device_name": row.pop("name"), **row}


def release_device_statuses_in(*, release: Release, state: str) -> StatusRows:
    """release_device_statuses(state=...) for a state in REPORTED_ONLY_STATES, as a query: the
    same rows in the same order (device name in code-point order, as Python sorts, then id),
    so a page of them is one indexed read, not the whole release's rows built and sorted."""
    if state not in REPORTED_ONLY_STATES:
        raise ValueError(f"{state!r} is also given to devices without a report")
    rows = DeviceReleaseStatus.objects.filter(release=release, state=state)
    ordered = rows.order_by(Collate("device__name", "C"), "device_id")
    return StatusRows(
        ordered.values(
            "state",
            "reason_code",
            "message",
            "assignment_counter",
            "reported_at",
            "updated_at",
            name=F("device__name"),
            device_key=Cast("device_id", output_field=CharField()),
        )
    )
