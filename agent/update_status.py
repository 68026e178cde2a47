"""What the agent tells the control plane about its update at every check-in.

The lifecycle's state says where an update stands; its last outcome (kept in
``update_status.json``, so a restart still reports it) says how the latest one ended and
why: a refusal, a failure that will be retried, or a rollback. Reason codes are short and
machine-readable; messages are for people and at most ``MAX_MESSAGE`` characters.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.files import read_json, write_json_atomic
from agent.install import Offer
from deploy.proto import agent_pb2

MAX_MESSAGE = 500
MAX_REASON_CODE = 32
MAX_COUNTER = 2**63 - 1  # the control plane stores it in a signed 64-bit column
EARLIEST, LATEST = 946_684_800.0, 7_258_118_400.0  # 2000-01-01 and 2200-01-01: what the gateway accepts
REPORTED_STATES = (
    "idle",
    "downloading",
    "verifying",
    "staged",
    "installed",
    "running",
    "refused",
    "failed",
    "rolled_back",
)
# the lifecycle's states that are an update in progress, as reported
IN_PROGRESS = {
    "downloading": "downloading",
    "verifying": "verifying",
    "staged": "staged",
    "switching": "installed",
    "probation": "running",
    "rolling_back": "rolled_back",
}


@dataclass(frozen=True)
class Outcome:
    """How the latest update ended."""

    state: str  # running, refused, failed or rolled_back
    version_id: str
    release_id: str = ""
    reason_code: str = ""
    message: str = ""
    at: float = 0.0
    counter: int = 0


def reason_code(stage: str, message: str) -> str:
    """The machine-readable reason for a failed step (the lifecycle reports stage and message)."""
    text = message.lower()
    if stage == "download":
        return "disk_space" if "free space" in text or "disk filled" in text else "download"
    if stage == "verify":
        if "device class" in text:
            return "wrong_device_class"
        if "older than what this device has run" in text or "counter" in text:
            return "stale_counter"
        return "verification"
    if stage == "compatibility":
        return "incompatible"
    if "crash loop" in text:
        return "activation"
    if stage in ("health", "probation"):
        return "health_check"
    return "rollback"


def outcome_from_report(payload: dict[str, Any], offer: Offer | None, counter: int = 0) -> Outcome | None:
    """The outcome an activation report records, or None for a report that is not one."""
    version_id = str(payload.get("version_id") or (offer.version_id if offer else ""))
    release_id = offer.release_id if offer and offer.version_id == version_id else ""
    now = time.time()
    if payload.get("ok"):
        if offer is not None and offer.rollback:
            label = offer.version_label or version_id
            return Outcome(
                "rolled_back", version_id, release_id, "rollback", f"rolled back to {label}", now, counter
            )
        return Outcome("running", version_id, release_id, at=now, counter=counter)
    stage = str(payload.get("stage") or "")
    message = str(payload.get("reason") or "")[:MAX_MESSAGE]
    code = clean_reason_code(str(payload.get("code") or "")) or reason_code(stage, message)
    state = "rolled_back"  # it was activated and went back
    if payload.get("refused"):  # a download may work next time (it is retried): failed; else final
        state = "failed" if stage == "download" else "refused"
    return Outcome(state, version_id, release_id, code, message, now, counter)


def clean_reason_code(code: str) -> str:
    """A code the gateway accepts (a-z, 0-9, _; at most 32), or "" (the caller derives one)."""
    code = re.sub(r"[^a-z0-9_]+", "_", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", code).lower()).strip("_")
    return code[:MAX_REASON_CODE] if code[:1].isalpha() else ""


def _uuid_or_empty(value: str) -> str:
    try:
        return str(uuid.UUID(value)) if len(value) == 36 else ""
    except ValueError:
        return ""


def _counter(value: int) -> int:
    return min(max(0, int(value)), MAX_COUNTER)


def _clean(status: agent_pb2.UpdateStatus) -> agent_pb2.UpdateStatus:
    """What the gateway would refuse, made acceptable here: a refused field would fail the whole
    check-in, every time, and a device that cannot check in cannot be told anything."""
    status.version_id = _uuid_or_empty(status.version_id)
    status.release_id = _uuid_or_empty(status.release_id)
    if status.state not in REPORTED_STATES or (status.state != "idle" and not status.version_id):
        status.state, status.version_id, status.release_id = "idle", "", ""
    status.reason_code = clean_reason_code(status.reason_code)
    status.message = status.message.replace("\x00", "")[:MAX_MESSAGE]
    if not (math.isfinite(status.at) and EARLIEST <= status.at <= LATEST):
        status.at = 0.0  # a device clock that is off (no RTC: 1970) sends no time rather than a wrong one
    return status


class StatusBook:
    """The latest outcome, durable in the agent's state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "update_status.json"

    def latest(self) -> Outcome | None:
        data = read_json(self.path, None)
        if not isinstance(data, dict):
            return None
        try:
            outcome = Outcome(**{k: data[k] for k in Outcome.__dataclass_fields__ if k in data})
        except TypeError:
            return None  # an unreadable record is no outcome, not a crash
        texts = (outcome.state, outcome.version_id, outcome.release_id, outcome.reason_code, outcome.message)
        numbers_ok = isinstance(outcome.counter, int) and isinstance(outcome.at, int | float)
        return outcome if numbers_ok and all(isinstance(t, str) for t in texts) else None

    def record(self, outcome: Outcome) -> None:
        write_json_atomic(self.path, asdict(outcome))


def update_status(
    *,
    lifecycle_state: str,
    offer: Offer | None,
    counter: int,
    entered_at: float,
    running_version: str,
    latest: Outcome | None,
) -> agent_pb2.UpdateStatus:
    """The UpdateStatus for a check-in: the update in progress, else the latest outcome."""
    if lifecycle_state in IN_PROGRESS and offer is not None:
        status = agent_pb2.UpdateStatus(
            state=IN_PROGRESS[lifecycle_state],
            version_id=offer.version_id,
            release_id=offer.release_id,
            assignment_counter=_counter(counter),
            at=float(entered_at),
        )
    elif latest is not None:
        status = agent_pb2.UpdateStatus(
            state=latest.state,
            version_id=latest.version_id,
            release_id=latest.release_id,
            assignment_counter=_counter(latest.counter),
            reason_code=latest.reason_code,
            message=latest.message,
            at=float(latest.at),
        )
    elif running_version:
        status = agent_pb2.UpdateStatus(state="running", version_id=running_version, at=float(entered_at))
    else:
        status = agent_pb2.UpdateStatus(state="idle", at=float(entered_at))
    return _clean(status)
