"""Readers never crash on stored data, even rows stored before the gateway's schema existed."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from ferry_cloud.observability.selectors import update_failures
from fleet.services import device_enrol, enrolment_token_create
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from telemetry.models import TelemetryRecord
from telemetry.selectors import first_report_at, fleet_rates, record_counts, release_gate_telemetry

# what jsonb can hold (no NaN, no NUL, no surrogates), in the places readers look
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3),
    max_leaves=8,
)
figures = st.sampled_from(
    ["inferences", "errors", "restarts", "latency_ms_p50", "latency_ms_p95", "top1_histogram", "ok", "stage"]
)
payloads = st.dictionaries(figures, values, max_size=6) | values.filter(
    lambda v: v is not None
)  # None is SQL NULL


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stored=st.lists(st.tuples(st.sampled_from(["metrics", "activation", "event"]), payloads), max_size=6))
def test_summaries_gates_and_dashboards_read_any_stored_payload(org, stored):
    device = (
        getattr(org, "_reader_device", None)
        or device_enrol(
            token=enrolment_token_create(organisation=org).token, name="old", attributes={}, labels={}
        ).device
    )
    org._reader_device = device
    TelemetryRecord.objects.filter(device=device).delete()
    for seq, (kind, payload) in enumerate(stored, start=1):
        TelemetryRecord.objects.create(
            device=device, seq=seq, kind=kind, timestamp=timezone.now(), version_id="7", payload=payload
        )
    since = timezone.now() - timedelta(minutes=5)
    rates = fleet_rates(organisation=org, window_seconds=600)
    assert rates["inferences_per_second"] >= 0 or rates["inferences_per_second"] < 0  # a number
    read = release_gate_telemetry(organisation_id=org.pk, version_id="7", since=since)
    treated, baseline = read.treated, read.baseline
    assert treated.devices_reporting <= 1 and baseline.devices_reporting == 0
    assert treated.records_skipped <= len(stored)
    release_gate_telemetry(organisation_id=org.pk, version_id="7", since=since, device_ids={str(device.pk)})
    first_report_at(device_ids={str(device.pk)}, version_id="7", since=since)
    assert sum(record_counts(organisation=org).values()) == len(stored)
    assert all(n > 0 for *_, n in update_failures())
