"""What the agent tells the control plane about its update at every check-in.

The lifecycle's state says where an update stands; its last outcome (kept in
``update_status.json``, so a restart still reports it) says how the latest one ended and
why: a refusal, a failure that will be retried, or a rollback. Reason codes are short and
machine-readable; messages are for people and at most ``MAX_MESSAGE`` characters.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.files import read_json, write_json_atomic
from agent.install import Offer
from deploy.proto import agent_pb2

MAX_MESSAGE = 500
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
            return "device_class"
        if "older than what this device has run" in text or "counter" in text:
            return "stale_assignment"
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
    code = str(payload.get("code") or "") or reason_code(stage, message)
    state = "rolled_back"  # it was activated and went back
    if payload.get("refused"):  # a download may work next time (it is retried): failed; else final
        state = "failed" if stage == "download" else "refused"
    return Outcome(state, version_id, release_id, code, message, now, counter)


class StatusBook:
    """The latest outcome, durable in the agent's state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "update_status.json"

    def latest(self) -> Outcome | None:
        data = read_json(self.path, None)
        if not isinstance(data, dict):
            return None
        try:
            return Outcome(**{k: data[k] for k in Outcome.__dataclass_fields__ if k in data})
        except TypeError:
            return None  # an unreadable record is no outcome, not a crash

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
        return agent_pb2.UpdateStatus(
            state=IN_PROGRESS[lifecycle_state],
            version_id=offer.version_id,
            release_id=offer.release_id,
            assignment_counter=max(0, int(counter)),
            at=float(entered_at),
        )
    if latest is not None and latest.state in REPORTED_STATES:
        return agent_pb2.UpdateStatus(
            state=latest.state,
            version_id=latest.version_id,
            release_id=latest.release_id,
            assignment_counter=max(0, int(latest.counter)),
            reason_code=latest.reason_code,
            message=latest.message[:MAX_MESSAGE],
            at=float(latest.at),
        )
    if running_version:
        return agent_pb2.UpdateStatus(state="running", version_id=running_version, at=float(entered_at))
    return agent_pb2.UpdateStatus(state="idle", at=float(entered_at))
