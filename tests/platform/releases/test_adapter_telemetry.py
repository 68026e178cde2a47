"""Per-adapter telemetry as an agent sends it (agent/adapters.py, agent/daemon.py): one metrics
record per served adapter under the adapter's own version, with its name and base, passes the
gateway's schema and is stored like any version's record, so a release of the adapter reads it."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

from fleet.services import device_enrol, enrolment_token_create
from telemetry.models import TelemetryRecord
from telemetry.schema import validate_record
from telemetry.selectors import release_gate_telemetry
from telemetry.services import telemetry_ingest

from agent.adapters import AdapterFigures


def test_an_adapter_metrics_record_is_accepted_and_stored_under_the_adapter_version(org) -> None:
    token = enrolment_token_create(organisation=org, labels={}).token
    device = device_enrol(token=token, name="dev", attributes={}, labels={}).device
    adapter_version, base_version = str(uuid.uuid4()), str(uuid.uuid4())
    since = time.time()
    figures = AdapterFigures(requests=3, errors=1, prompt_tokens=30, tokens_generated=12).summary()
    payload = {**figures, "version": adapter_version, "adapter": "pirate", "base_version": base_version}
    record = validate_record(
        seq=1,
        kind="metrics",
        timestamp=time.time(),
        version_id=adapter_version,
        payload_json=json.dumps(payload),
    )
    telemetry_ingest(device=device, records=[record])
    stored = TelemetryRecord.objects.get(device=device, version_id=adapter_version)
    assert stored.payload["adapter"] == "pirate" and stored.payload["base_version"] == base_version
    assert stored.payload["llm_requests"] == 3 and stored.payload["llm_errors"] == 1
    assert stored.payload["llm_tokens_generated"] == 12
    cohort = release_gate_telemetry(
        organisation_id=org.pk, version_id=adapter_version, since=datetime.fromtimestamp(since - 1, UTC)
    ).treated
    assert cohort.devices_reporting == 1 and cohort.records_skipped == 0
