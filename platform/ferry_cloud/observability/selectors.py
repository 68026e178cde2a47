"""Fleet-wide reads for the domain gauges: one aggregate query each, across organisations.

The apps' own selectors answer per organisation (what the API and console show); these sum
the whole deployment for /metrics, and read only what is stored (no figure is invented).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

# Bounds on label sets: a scrape must stay cheap however large the deployment grows.
MAX_VERSION_SERIES = 2000
MAX_LIVE_RELEASES = 200


@dataclass(frozen=True)
class VersionCount:
    organisation: str
    model: str
    version: str
    devices: int


@dataclass(frozen=True)
class ReleaseCount:
    organisation: str
    release_id: str
    release: str
    state: str
    version: str
    on_release_version: int
    on_other_versions: int


@dataclass(frozen=True)
class UpdateFailureCount:
    organisation: str
    stage: str
    outcome: str  # "refused" (never installed) or "rolled_back" (installed, then undone)
    records: int


def devices_by_state(*, online_seconds: int) -> dict[str, int]:
    """online (checked in recently), offline, never_seen, revoked: every device in exactly one."""
    from fleet.models import Device

    cutoff = timezone.now() - timedelta(seconds=online_seconds)
    live = Q(revoked_at__isnull=True)
    return Device.objects.aggregate(
        online=Count("pk", filter=live & Q(last_seen_at__gte=cutoff)),
        offline=Count("pk", filter=live & Q(last_seen_at__lt=cutoff)),
        never_seen=Count("pk", filter=live & Q(last_seen_at__isnull=True)),
        revoked=Count("pk", filter=Q(revoked_at__isnull=False)),
    )


def devices_by_version() -> list[VersionCount]:
    """Live devices per organisation and running version ("" when a device runs nothing yet)."""
    from fleet.models import Device

    rows = (
        Device.objects.filter(revoked_at__isnull=True)
        .values("organisation__slug", "running_version__model__name", "running_version__label")
        .annotate(n=Count("pk"))
        .order_by("organisation__slug", "running_version__model__name", "running_version__label")
    )[:MAX_VERSION_SERIES]
    return [
        VersionCount(
            r["organisation__slug"],
            r["running_version__model__name"] or "",
            r["running_version__label"] or "",
            r["n"],
        )
        for r in rows
    ]


def conversion_jobs_by_status() -> dict[str, int]:
    """Every status present, zero included, so a drained queue reads 0 rather than vanishing."""
    from registry.models import ConversionJob

    counts = dict.fromkeys(ConversionJob.Status.values, 0)
    for row in ConversionJob.objects.values("status").annotate(n=Count("pk")):
        counts[row["status"]] = row["n"]
    return counts


def live_release_device_counts() -> list[ReleaseCount]:
    """Active and paused releases: devices on the release's version and on others (releases' selector)."""
    from releases.models import Release
    from releases.selectors import release_device_counts

    live = (
        Release.objects.filter(state__in=(Release.State.ACTIVE, Release.State.PAUSED))
        .select_related("organisation", "version")
        .order_by("-created_at")[:MAX_LIVE_RELEASES]
    )
    counts = []
    for release in live:
        figures = release_device_counts(release=release)
        counts.append(
            ReleaseCount(
                release.organisation.slug,
                str(release.pk),
                release.name,
                release.state,
                release.version.label,
                figures["on_release_version"],
                figures["on_other_versions"],
            )
        )
    return counts


def update_failures() -> list[UpdateFailureCount]:
    """Failed activations the agents reported (telemetry kind "activation", ok false), by stage."""
    from telemetry.models import TelemetryRecord

    rows = (
        TelemetryRecord.objects.filter(kind="activation", payload__ok=False)
        .values("device__organisation__slug", "payload__stage", "payload__refused")
        .annotate(n=Count("pk"))
    )
    totals: dict[tuple[str, str, str], int] = {}
    for r in rows:
        outcome = "refused" if r["payload__refused"] else "rolled_back"
        key = (r["device__organisation__slug"], str(r["payload__stage"] or "unknown"), outcome)
        totals[key] = totals.get(key, 0) + r["n"]
    return [UpdateFailureCount(*key, n) for key, n in sorted(totals.items())]
