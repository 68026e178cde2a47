"""The fleet bench/rest_scale.py reads: 10,000 or 100,000 devices filled in bulk SQL.

Everything a REST read looks at is there, in proportions a real fleet has: attributes (70 %
hw=pi, 20 % jetson, 10 % x86; 50 sites), labels (5 % canary), two versions (60 % run v1,
30 % v2, 10 % none), 1 % pinned, 1 % revoked, enrolment over 180 days, last seen over a week
(5 % never), a static group of 5 % and a dynamic group (hw == jetson), an active release of v2
to ``hw == pi`` with a status row for 90 % of its devices (most running, some refused or failed)
and --records telemetry records per device, plus one busy device with 5,000. Rows are made by
INSERT ... SELECT over generate_series on the server (seconds, not minutes), then vacuumed
and analysed.
"""

from __future__ import annotations

from dataclasses import dataclass

BUSY_RECORDS = 5000
RELEASE_FILTER = "hw == pi"


@dataclass(frozen=True)
class Fleet:
    token: str
    release_id: str
    version_id: str  # v2, the release's
    group_id: str  # the static group
    busy_device_id: str  # the device with BUSY_RECORDS telemetry records


def _versions(org) -> tuple:
    from registry.models import Artifact, Model, ModelVersion

    model = Model.objects.create(organisation=org, name="bench-model")
    versions = []
    for label in ("v1", "v2"):
        digest = (label * 32)[:64]
        source = Artifact.objects.create(
            organisation=org, kind="onnx", file=f"bench/{label}.onnx", sha256=digest, size=1
        )
        package = Artifact.objects.create(
            organisation=org, kind="package", file=f"bench/{label}.pkg", sha256=digest[::-1], size=1
        )
        versions.append(
            ModelVersion.objects.create(
                model=model, label=label, status="ready", source=source, package=package, released=True
            )
        )
    return versions[0], versions[1]


DEVICES_SQL = """
INSERT INTO fleet_device (id, organisation_id, name, certificate_serial, attributes, labels,
    running_version_id, pinned_version_id, enrolled_at, last_seen_at, revoked_at, release_key_sequence)
SELECT gen_random_uuid(), %(org)s, 'd' || lpad(i::text, 6, '0'), '',
    jsonb_build_object(
        'hw', CASE WHEN r.a < 0.7 THEN 'pi' WHEN r.a < 0.9 THEN 'jetson' ELSE 'x86' END,
        'os', 'linux', 'site', 'site-' || (i %% 50), 'agent_version', '1.' || (i %% 4) || '.0'),
    jsonb_build_object('ring', CASE WHEN r.b < 0.05 THEN 'canary' ELSE 'prod' END),
    CASE WHEN r.c < 0.6 THEN %(v1)s::uuid WHEN r.c < 0.9 THEN %(v2)s::uuid END,
    CASE WHEN r.d < 0.01 THEN %(v1)s::uuid END,
    now() - r.e * interval '180 days',
    CASE WHEN r.f >= 0.05 THEN now() - r.f * r.f * r.f * interval '7 days' END,
    CASE WHEN r.d > 0.99 THEN now() - interval '1 day' END,
    0
FROM generate_series(1, %(n)s) AS i,
    LATERAL (SELECT random() + i * 0 AS a, random() AS b, random() AS c, random() AS d,
                    random() AS e, random() AS f) AS r
"""

STATUSES_SQL = """
INSERT INTO releases_devicereleasestatus (release_id, device_id, state, reason_code, message,
    assignment_counter, reported_at, updated_at)
SELECT %(release)s, d.id, s.state,
    CASE WHEN s.state IN ('refused', 'failed') THEN 'verification' ELSE '' END,
    CASE WHEN s.state IN ('refused', 'failed') THEN 'bench: the package did not verify' ELSE '' END,
    1, now() - random() * interval '1 day', now() - random() * interval '1 day'
FROM fleet_device d,
    LATERAL (SELECT CASE WHEN r < 0.85 THEN 'running' WHEN r < 0.9 THEN 'installed'
                         WHEN r < 0.95 THEN 'downloading' WHEN r < 0.98 THEN 'refused' ELSE 'failed' END
             AS state FROM (SELECT random() + length(d.name) * 0 AS r) AS x) AS s
WHERE d.organisation_id = %(org)s AND d.revoked_at IS NULL AND d.attributes->>'hw' = 'pi'
    AND random() < 0.9
"""

TELEMETRY_SQL = """
INSERT INTO telemetry_telemetryrecord (device_id, seq, kind, timestamp, version_id, payload, received_at)
SELECT d.id, %(offset)s + s, 'metrics', now() - (%(n)s - s) * interval '30 seconds',
    COALESCE(d.running_version_id::text, ''),
    jsonb_build_object('inferences', 100 + s %% 7, 'errors', s %% 3, 'latency_ms_p50', 4.5,
                       'latency_ms_p95', 9.0, 'restarts', 0),
    now() - (%(n)s - s) * interval '30 seconds'
FROM fleet_device d, generate_series(1, %(n)s) AS s
WHERE d.organisation_id = %(org)s AND (%(device)s::uuid IS NULL OR d.id = %(device)s::uuid)
"""


def _execute(sql: str, params: dict) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _groups(org) -> str:
    from fleet.models import DeviceGroup

    static = DeviceGroup.objects.create(organisation=org, name="bench-static", kind="static")
    DeviceGroup.objects.create(organisation=org, name="bench-jetsons", kind="dynamic", filter="hw == jetson")
    _execute(
        "INSERT INTO fleet_devicegroup_members (devicegroup_id, device_id) "
        "SELECT %(group)s, id FROM fleet_device WHERE organisation_id = %(org)s AND random() < 0.05",
        {"group": static.pk, "org": org.pk},
    )
    return str(static.pk)


def _release(org, user, version) -> str:
    from releases import selectors
    from releases.models import Release, ReleaseEvent

    release = Release.objects.create(
        organisation=org,
        name="bench-release",
        version=version,
        state="active",
        target={"filter": RELEASE_FILTER},
        created_by=user,
    )
    selection = selectors.release_selection(release)  # what the start would store
    Release.objects.filter(pk=release.pk).update(
        bucket_threshold=selection.threshold, threshold_phase=0, matching_devices=len(selection.matching)
    )
    for action, before, after in (("create", "", "draft"), ("start", "draft", "active")):
        ReleaseEvent.objects.create(
            release=release, action=action, from_state=before, to_state=after, actor=user, from_phase=0
        )
    _execute(STATUSES_SQL, {"release": release.pk, "org": org.pk})
    return str(release.pk)


def fill(devices: int, records: int) -> Fleet:
    """Migrate the (empty) database Django points at and fill it; the admin's API token in the answer."""
    from accounts.services import organisation_ensure, user_ensure_admin
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from fleet.models import Device

    call_command("migrate", verbosity=0)
    org = organisation_ensure(name="Bench")
    _, token = user_ensure_admin(organisation=org, username="bench", password="bench-password-1")
    user = get_user_model().objects.get(username="bench")
    v1, v2 = _versions(org)
    _execute(DEVICES_SQL, {"org": org.pk, "v1": v1.pk, "v2": v2.pk, "n": devices})
    group_id = _groups(org)
    release_id = _release(org, user, v2)
    busy = Device.objects.filter(organisation=org, revoked_at__isnull=True).order_by("name").first()
    if records:
        _execute(TELEMETRY_SQL, {"org": org.pk, "n": records, "device": None, "offset": 0})
    busy_records = {"org": org.pk, "n": BUSY_RECORDS, "device": busy.pk, "offset": records}
    _execute(TELEMETRY_SQL, busy_records)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # a settled fleet: autovacuum has been by
    return Fleet(
        token=token,
        release_id=release_id,
        version_id=str(v2.pk),
        group_id=group_id,
        busy_device_id=str(busy.pk),
    )
