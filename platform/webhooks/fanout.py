"""From a recorded event to webhook deliveries: the event, shaped as the feed shows it.

Subscribed to ferry_cloud.events.AuditEventRecorded by WebhooksConfig.ready; it runs after the
event's transaction committed, in whichever process recorded it. The payload is the feed's own
row (releases.api.AuditEventOutput), so a webhook, the SSE stream and GET /api/v1/audit/ carry
the same JSON for the same event.
"""

from __future__ import annotations

import json

from ferry_cloud.events import AuditEventRecorded
from releases.api import AuditEventOutput
from releases.models import ReleaseEvent

from webhooks import services


def event_payload(event: ReleaseEvent) -> dict:
    """The feed's JSON row of the event, as plain JSON values."""
    return json.loads(json.dumps(AuditEventOutput(event).data, default=str))


def event_recorded(event: AuditEventRecorded) -> None:
    if not services.webhooks_listening(organisation_id=event.organisation_id):
        return  # the common case: one query, nothing else
    row = ReleaseEvent.objects.select_related("actor", "release").filter(pk=event.event_id).first()
    if row is None:
        return
    payload = event_payload(row)
    services.deliveries_create(
        organisation_id=event.organisation_id,
        event_id=row.pk,
        event_type=payload["type"],
        payload=payload,
    )
