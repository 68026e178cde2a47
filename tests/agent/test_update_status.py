"""What the agent reports about its update at check-in, from the lifecycle's own reports."""

from __future__ import annotations

from agent.install import Offer
from agent.update_status import MAX_MESSAGE, Outcome, StatusBook, outcome_from_report, update_status

V2 = "5f0c8a9e-8d4f-4e0b-9a43-4f3f2b8c1d21"
R2 = "9a1e6d3c-0b0f-4a36-8d5c-3b7e2a6f4c10"
OFFER = Offer(R2, V2, "v2", "classifier", "d" * 64, 1234)


def _outcome(stage: str, reason: str, refused: bool = True) -> Outcome:
    payload = {"ok": False, "version_id": V2, "reason": reason, "stage": stage}
    return outcome_from_report({**payload, "refused": True} if refused else payload, OFFER, 3)


def test_refusals_failures_and_rollbacks_carry_a_reason_code():
    assert (_outcome("verify", "the package is signed for device class 'x'; this device is 'y'").state,) == (
        "refused",
    )
    assert _outcome("verify", "signed for device class 'x'").reason_code == "wrong_device_class"
    assert _outcome("verify", "older than what this device has run (signed counter 1 < 2)").reason_code == (
        "stale_counter"
    )
    assert _outcome("verify", "manifest.sig is malformed").reason_code == "verification"
    disk = _outcome("download", "not enough free space for package abc")
    assert (disk.state, disk.reason_code) == ("failed", "disk_space")  # retried later: failed, not refused
    assert _outcome("download", "arrived with the wrong size").reason_code == "download"
    health = _outcome("health", "the new version does not load or run", refused=False)
    assert (health.state, health.reason_code, health.release_id) == ("rolled_back", "health_check", R2)
    assert _outcome("probation", "crash loop: the agent restarted 3 times", refused=False).reason_code == (
        "activation"
    )
    coded = outcome_from_report(
        {"ok": False, "stage": "verify", "code": "incompatible", "refused": True}, OFFER
    )
    assert coded.reason_code == "incompatible"  # an exception's own code wins
    assert len(_outcome("verify", "x" * 5000).message) == MAX_MESSAGE


def test_the_status_is_the_update_in_progress_else_the_last_outcome(tmp_path):
    book = StatusBook(tmp_path)
    assert book.latest() is None
    idle = update_status(
        lifecycle_state="idle", offer=None, counter=0, entered_at=1.0, running_version="", latest=None
    )
    assert idle.state == "idle" and not idle.version_id
    switching = update_status(
        lifecycle_state="switching", offer=OFFER, counter=4, entered_at=2.0, running_version="", latest=None
    )
    assert (switching.state, switching.version_id, switching.release_id, switching.assignment_counter) == (
        "installed",
        V2,
        R2,
        4,
    )
    book.record(_outcome("verify", "signed for device class 'x'"))
    restarted = StatusBook(tmp_path).latest()  # durable: a restart still reports it
    status = update_status(
        lifecycle_state="idle", offer=None, counter=0, entered_at=3.0, running_version="v1", latest=restarted
    )
    assert (status.state, status.reason_code, status.version_id, status.assignment_counter) == (
        "refused",
        "wrong_device_class",
        V2,
        3,
    )
    (tmp_path / "update_status.json").write_text('{"bogus": true}')
    assert StatusBook(tmp_path).latest() is None  # an unreadable record is no outcome, not a crash
    (tmp_path / "update_status.json").write_text('{"state": 1, "version_id": "x", "counter": "many"}')
    assert StatusBook(tmp_path).latest() is None  # wrong types too
    (tmp_path / "update_status.json").write_text("[]")
    assert StatusBook(tmp_path).latest() is None


def test_a_malformed_record_is_cleaned_so_the_check_in_still_goes_through():
    weird = Outcome(
        state="refused",
        version_id=V2,
        release_id="not-a-uuid",
        reason_code="SignatureError!",
        message="nul\x00" + "y" * 900,
        at=12.0,  # a device without a real-time clock thinks it is 1970
        counter=2**64,
    )
    status = update_status(
        lifecycle_state="idle", offer=None, counter=0, entered_at=0, running_version="", latest=weird
    )
    assert (status.state, status.version_id, status.release_id) == ("refused", V2, "")
    assert status.reason_code == "signature_error" and "\x00" not in status.message
    assert len(status.message) == MAX_MESSAGE and status.at == 0.0 and status.assignment_counter == 2**63 - 1
    broken = Outcome(state="exploded", version_id="../x")
    status = update_status(
        lifecycle_state="idle", offer=None, counter=0, entered_at=0, running_version="", latest=broken
    )
    assert status.state == "idle" and not status.version_id
