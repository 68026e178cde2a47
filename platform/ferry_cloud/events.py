"""Domain events: services say what changed; the doors that care subscribe.

A service calls ``publish(FleetChanged(organisation_id=...))`` and knows nothing of who
listens (in the spirit of Zulip's send_event). Doors subscribe when their app is ready:
the gateway's AppConfig registers the hint that wakes connected agents. Subscribers run
after the surrounding transaction commits, so a rolled-back write announces nothing and a
listener that reads the database sees the change; outside a transaction they run at once.

No door is imported here (tests/test_architecture.py checks it).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from django.db import transaction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetChanged:
    """What some devices of this organisation should run may have changed: a release, a group,
    a pin. It carries no instruction; the devices' next check-in works out what."""

    organisation_id: int


@dataclass(frozen=True)
class DeviceRevoked:
    """A device was revoked: whoever answers devices from memory must forget this one."""

    organisation_id: int
    device_id: str


@dataclass(frozen=True)
class AuditEventRecorded:
    """A row was added to the organisation's event feed (a ReleaseEvent): a release's state
    change, a device's refusal or failure, a bulk device action. Webhooks and live streams
    start from it."""

    organisation_id: int
    event_id: int


# The event feed's types: what webhooks subscribe to and streams filter on. Each is one audit
# action, "release.completed" being the advance into the completed state ("!completed": any other).
# A bulk device action (fleet.bulk) is one event of its own type, whatever number of devices it changed.
EVENT_TYPES: dict[str, tuple[str, str | None]] = {
    "release.created": ("create", None),
    "release.edited": ("edit", None),
    "release.started": ("start", None),
    "release.paused": ("pause", None),
    "release.resumed": ("resume", None),
    "release.advanced": ("advance", "!completed"),
    "release.completed": ("advance", "completed"),
    "release.aborted": ("abort", None),
    "release.rolled_back": ("rollback", None),
    "release.activated": ("activate", None),
    "device.refused": ("device_refused", None),
    "device.failed": ("device_failed", None),
    "device.rolled_back": ("device_rolled_back", None),
    "devices.bulk_pin": ("bulk_pin", None),
    "devices.bulk_unpin": ("bulk_unpin", None),
    "devices.bulk_label": ("bulk_label", None),
    "devices.bulk_revoke": ("bulk_revoke", None),
}


def event_type(action: str, to_state: str) -> str:
    """The feed type of an audit row with this action and resulting release state."""
    for name, (wanted, state) in EVENT_TYPES.items():
        if wanted != action:
            continue
        if state is None or state == to_state or (state.startswith("!") and state[1:] != to_state):
            return name
    return f"release.{action}"  # an action added later still gets a type


E = TypeVar("E")
_subscribers: dict[type, list[Callable[[Any], None]]] = defaultdict(list)


def subscribe(event_type: type[E], subscriber: Callable[[E], None]) -> None:
    """Run ``subscriber(event)`` after every published event of that type; subscribing twice is once."""
    if subscriber not in _subscribers[event_type]:
        _subscribers[event_type].append(subscriber)


def publish(event: object) -> None:
    """Announce ``event`` to its subscribers once the current transaction commits.

    A subscriber that fails is logged, not raised: the write it announces has happened, and
    announcements are hints (losing one only delays whoever listens).
    """
    for subscriber in list(_subscribers.get(type(event), ())):
        transaction.on_commit(partial(_deliver, subscriber, event))


def _deliver(subscriber: Callable[[Any], None], event: object) -> None:
    try:
        subscriber(event)
    except Exception:
        log.exception("subscriber %s failed on %r", getattr(subscriber, "__qualname__", subscriber), event)
