"""The update lifecycle: one explicit state machine, persisted before every step.

The state lives in ``update.json`` (written atomically), so a restart or a power cut
resumes where it was:

    idle ──offer──► downloading ──► verifying ──► staged ──► switching ──► probation ──► idle
                         │              │            │            │             │
                         └──── refused (reason reported, running version untouched) ──► idle
                                              unhealthy / crash loop ─┴─► rolling_back ─► idle

- downloading: resumable (downloads/<digest>.part); a broken link or a slow one keeps the part.
- offer: the signed assignment is verified first (agent.trust: this device, its tenant, not
  expired, a counter above the last accepted); nothing is fetched for a refused one.
- verifying: the archive's sha256 and size as assigned, then the signature, device class,
  organisation, the assigned manifest digest, every file's sha256 and size, strict
  unpack into a staging directory renamed into versions/<id> (deploy.package, one pass). A
  refused archive that is not the offered one (its sha256) is a download error, retried.
- staged: verified and waiting: a download-only offer, or a maintenance window not open yet.
- switching: `current` is (being) switched to the new version; the health check runs the
  package's self-test. A crash here re-runs the health check on restart; too many crashes
  in a row are a crash loop and roll back.
- probation: committed (running.json names the new version) but a crash loop during the
  first ``probation_seconds`` still rolls back to the previous version.
- rolling_back: `current` is switched back to the previous version.

``running.json`` always names the version `current` points at once it is committed, and the
assignment counter that put it there, or the LoRA adapter installed beside it (agent/adapters.py):
an adapter goes through the same states, but at switching it joins ``adapters.json`` instead of
moving `current`, and one bound to another base is refused at verifying (``incompatible``).  An
offer of what is already on disk and active (the base under an adapter, an installed adapter:
a rollback or a pin) is taken at once, without a download; a rollback away from an adapter
removes that adapter, and one that fails in probation gives its name back to the version it
replaced.  Refusals are reported with ``stage``, ``reason`` and a
machine-readable ``code``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from agent import adapters as lora
from agent.errors import (
    ActivationError,
    AgentError,
    DiskFullError,
    DownloadError,
    DownloadStalled,
    IncompatibleModel,
)
from agent.files import read_json, write_json_atomic
from agent.install import Installer, Offer, health_check, package_check
from agent.refusals import Refusals
from agent.trust import AssignmentTrust, SignedOffer
from deploy.errors import PackageRejected
from deploy.trust.assignment import AssignmentRefused

log = logging.getLogger(__name__)

IDLE, DOWNLOADING, VERIFYING, STAGED = "idle", "downloading", "verifying", "staged"
SWITCHING, PROBATION, ROLLING_BACK = "switching", "probation", "rolling_back"
STATES = (IDLE, DOWNLOADING, VERIFYING, STAGED, SWITCHING, PROBATION, ROLLING_BACK)

# The transition table: (state, event) -> next state. Anything else is a bug, not a guess.
TRANSITIONS: dict[tuple[str, str], str] = {
    (IDLE, "offer"): DOWNLOADING,
    (STAGED, "offer"): DOWNLOADING,
    (DOWNLOADING, "offer"): DOWNLOADING,
    (DOWNLOADING, "downloaded"): VERIFYING,
    (VERIFYING, "verified"): STAGED,
    (STAGED, "activate"): SWITCHING,
    (SWITCHING, "healthy"): PROBATION,
    (SWITCHING, "unhealthy"): ROLLING_BACK,
    (PROBATION, "offer"): DOWNLOADING,
    (PROBATION, "stable"): IDLE,
    (PROBATION, "crash_loop"): ROLLING_BACK,
    (ROLLING_BACK, "rolled_back"): IDLE,
    (DOWNLOADING, "refused"): IDLE,
    (VERIFYING, "refused"): IDLE,
    (STAGED, "refused"): IDLE,
}

MAX_HEALTH_ATTEMPTS = 3  # agent deaths during one health check before it counts as a crash loop
REFUSED_RETRY_SECONDS = 900.0  # when a refusal may be retried (disk full); None = never


@dataclass
class UpdateState:
    state: str = IDLE
    offer: dict[str, Any] | None = None
    previous: str = ""  # what `current` pointed at before the switch ("" = nothing)
    attempts: int = 0  # process starts seen in switching / probation
    probation_until: float = 0.0
    counter: int = 0  # the counter of the assignment being carried out
    clean_stop: bool = False  # the last process ended with SIGTERM, not a crash
    entered_at: float = field(default_factory=time.time)

    @property
    def current_offer(self) -> Offer | None:
        return Offer.from_dict(self.offer) if self.offer else None


class Lifecycle:
    """Drives one update at a time through the states; every transition is persisted first."""

    def __init__(
        self,
        installer: Installer,
        *,
        device_class: str,
        organisation_id: str = "",
        trust: AssignmentTrust | None = None,
        report: Callable[[str, dict[str, Any], str], None],
        on_version_change: Callable[[str], None],
        probation_seconds: float = 120.0,
        crash_loop_starts: int = 3,
    ) -> None:
        self.installer = installer
        self.device_class = device_class
        self.organisation_id = organisation_id
        self.trust = trust
        self.report = report
        self.on_version_change = on_version_change
        self.probation_seconds = probation_seconds
        self.crash_loop_starts = crash_loop_starts
        self.state_dir = installer.state_dir
        self.adapters = lora.AdapterBook(self.state_dir)
        self.refusals = Refusals(self.state_dir)
        self.update = self._load()
        self._pause_at = {s for s in os.environ.get("FERRY_AGENT_PAUSE_AT", "").split(",") if s}

    # --- persistence -------------------------------------------------------------------
    @property
    def update_file(self) -> Path:
        return self.state_dir / "update.json"

    @property
    def running_file(self) -> Path:
        return self.state_dir / "running.json"

    def _load(self) -> UpdateState:
        data = read_json(self.update_file, None)
        if not data:
            return UpdateState()
        return UpdateState(**{k: v for k, v in data.items() if k in UpdateState.__dataclass_fields__})

    def _save(self) -> None:
        write_json_atomic(self.update_file, self.update.__dict__)

    def running(self) -> dict[str, Any]:
        return read_json(self.running_file, {}) or {}

    def _transition(self, event: str, **changes: Any) -> None:
        key = (self.update.state, event)
        if key not in TRANSITIONS:
            raise AgentError(
                f"lifecycle bug: no transition for event {event!r} in state {self.update.state!r}"
            )
        nxt = TRANSITIONS[key]
        for name, value in changes.items():
            setattr(self.update, name, value)
        self.update.state, self.update.entered_at = nxt, time.time()
        if nxt == IDLE:
            self.update.offer, self.update.attempts, self.update.counter = None, 0, 0
        self._save()
        log.info("update state: %s --%s--> %s", key[0], event, nxt)
        self._maybe_pause(nxt)

    def _maybe_pause(self, point: str) -> None:
        """Fault injection for the kill-at-every-state tests (FERRY_AGENT_PAUSE_AT=state,...)."""
        if point in self._pause_at:
            seconds = float(os.environ.get("FERRY_AGENT_PAUSE_SECONDS", "30"))
            log.warning("pausing %.0f s at %s (FERRY_AGENT_PAUSE_AT)", seconds, point)
            time.sleep(seconds)

    # --- events ----------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self.update.state

    def offer_signed(self, signed: SignedOffer) -> Offer | None:
        """An offer from the gateway: act on its signed assignment (returned), or report why not (None)."""
        if self.trust is None:
            raise AgentError("lifecycle bug: no trusted keys to verify assignments with")
        try:
            assignment = self.trust.accept(signed)
        except AssignmentRefused as exc:
            self._refuse_assignment(signed, exc)
            return None
        offer = Offer.assigned(assignment, signed.version_label, signed.model_name)
        self.offer(offer)
        return offer

    def settled(self, offer: Offer | None) -> int:
        """The offer's assignment counter if receiving it again would change nothing: the device is
        idle and runs its version, or refused it for good; else 0. The check-in sends it as
        held_assignment_counter, so the gateway stops resending that assignment (but still sends
        it while an update is under way, or a refusal may be retried)."""
        if offer is None or self.update.state != IDLE:
            return 0
        if self._runs(offer.version_id):
            return offer.counter
        return offer.counter if self.refusals.for_good(offer) else 0

    def _refuse_assignment(self, signed: SignedOffer, exc: AssignmentRefused) -> None:
        """Report a refused assignment once (it comes again at every check-in); the update in
        progress, if any, carries on: a replayed or forged assignment must not disturb it."""
        if not self.refusals.remember_assignment(signed.sha256, str(exc)):
            return
        log.error("assignment refused (%s): %s", exc.code, exc)
        self._report_refusal("", "assignment", str(exc), exc.code)

    def offer(self, offer: Offer) -> None:
        """The control plane wants this package (a verified assignment); start or keep fetching it."""
        current = self.update.current_offer
        if offer.same_package(current):
            if self.update.state == STAGED and current != offer:
                self.update.offer = offer.as_dict()  # same bytes, new instructions (window, download-only)
                self._save()
            return
        if self.update.state in (SWITCHING, ROLLING_BACK, VERIFYING):
            return  # finish this step first; the offer comes again at the next check-in
        if self._runs(offer.version_id):
            return
        if self.refusals.blocks(offer):
            return
        if self.update.state == IDLE and self._present(offer.version_id):
            self._reassign(offer)
            return
        if current is not None:
            self.installer.discard(current)
        self._transition("offer", offer=offer.as_dict(), attempts=0)

    def _runs(self, version_id: str) -> bool:
        """Whether the device runs this version now: committed in running.json, and `current`
        (or, for an adapter, installed beside it)."""
        if version_id != self.running().get("version_id"):
            return False
        return version_id == self.installer.current_version() or self._installed_adapter(version_id)

    def _installed_adapter(self, version_id: str) -> bool:
        adapter = self.adapters.by_version(version_id)
        return adapter is not None and adapter.base_digest == lora.llm_base_digest(self._current_dir())

    def _present(self, version_id: str) -> bool:
        """Active on disk already: the current base, or an adapter installed beside it."""
        return version_id == self.installer.current_version() or self._installed_adapter(version_id)

    def _current_dir(self) -> Path | None:
        return self.installer.current_link if self.installer.current_version() else None

    def _reassign(self, offer: Offer) -> None:
        """Take an assignment of what is already active (the base under an adapter, or an
        installed adapter) without downloading anything; a rollback removes the adapter it
        goes back from."""
        running = self.running()
        before = running.get("version_id", "")
        if offer.rollback and before != offer.version_id:
            self._drop_rolled_back_adapter(before)
        self._commit_running(offer, offer.counter)
        self.on_version_change(self.installer.current_version())
        # the report's outcome reads the offer in hand (not saved: the state stays idle)
        self.update.offer, self.update.counter = offer.as_dict(), offer.counter
        try:
            self._report_ok(offer, before, "assigned", offer.counter)
        finally:
            self.update.offer, self.update.counter = None, 0
        log.info("now running %s:%s (already on the device)", offer.model_name, offer.version_label)

    def _drop_rolled_back_adapter(self, version_id: str) -> None:
        """A rollback away from an adapter removes it, whether its base was already active (no
        download) or is switched to again (an offer that came while the adapter was in probation)."""
        gone = self.adapters.remove_version(version_id) if version_id else None
        if gone is not None:
            log.info("adapter %s (%s) removed by the rollback", gone.name, version_id)

    def _commit_running(self, offer: Offer, counter: int) -> None:
        """running.json names the offer's version (and what ran before, for a rollback)."""
        running = self.running()
        write_json_atomic(
            self.running_file,
            {
                "version_id": offer.version_id,
                "package_digest": offer.package_digest,
                "counter": counter,
                "previous": {k: running.get(k) for k in ("version_id", "package_digest", "counter")},
            },
        )

    def resume(self) -> None:
        """Called once per process start: count unclean starts in the risky states (crash loops)."""
        if self.update.state in (SWITCHING, PROBATION):
            unclean = not self.update.clean_stop
            self.update.clean_stop = False
            if unclean:
                self.update.attempts += 1
            self._save()  # before the log line: a kill right after it must not lose the count
            if unclean:
                log.info("resuming in %s after an unclean stop (%d)", self.update.state, self.update.attempts)

    def wake_in(self) -> float:
        """Seconds until the lifecycle needs a step without a check-in (a timer, a retry)."""
        state = self.update.state
        if state == PROBATION:
            return max(0.2, self.update.probation_until - time.time())
        if state == STAGED:
            return 30.0  # a maintenance window may have opened
        if state in (DOWNLOADING, VERIFYING, SWITCHING, ROLLING_BACK):
            return 5.0  # an interrupted step resumes soon
        return 3600.0

    def shutdown(self) -> None:
        """A clean stop (SIGTERM) is not a crash: do not count it towards a crash loop."""
        if self.update.state in (SWITCHING, PROBATION):
            self.update.clean_stop = True
            self._save()

    def advance(self) -> None:
        """Run steps until the lifecycle has to wait (idle, staged, probation, or a transient error)."""
        while True:
            before = (self.update.state, self.update.entered_at)
            step = getattr(self, f"_step_{self.update.state}")
            try:
                step()
            except (grpc.RpcError, DownloadStalled) as exc:
                detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
                log.warning("update paused in %s, will resume: %s", self.update.state, detail)
                return
            if (self.update.state, self.update.entered_at) == before:
                return  # the step decided to wait

    # --- steps ------------------------------------------------------------------------------
    def _step_idle(self) -> None:
        return

    def _step_downloading(self) -> None:
        offer = self.update.current_offer
        try:
            self.installer.download(offer)
        except DiskFullError as exc:
            self._refuse(offer, "download", str(exc), retry_after=REFUSED_RETRY_SECONDS)
            return
        except DownloadStalled:
            raise
        except DownloadError as exc:  # wrong bytes from the gateway: its fault, maybe fixed later
            self._refuse(offer, "download", str(exc), retry_after=REFUSED_RETRY_SECONDS)
            return
        self._transition("downloaded")

    def _step_verifying(self) -> None:
        offer = self.update.current_offer
        check = package_check(
            device_class=self.device_class,
            organisation_id=self.organisation_id,
            manifest_sha256=offer.manifest_sha256,
        )

        def check_and_pause(verified) -> None:
            check(verified)
            self._maybe_pause("unpacking")  # the staging directory exists, no file is written yet

        try:
            self.installer.unpack(offer, self.installer.part_file(offer), check=check_and_pause)
        except PackageRejected as exc:
            self._refuse(offer, "verify", str(exc), code=getattr(exc, "code", "bad_package"))
            return
        except DownloadError as exc:  # refused, and not the offered bytes: the download's fault
            self._refuse(offer, "download", str(exc), retry_after=REFUSED_RETRY_SECONDS)
            return
        except FileNotFoundError:
            # the archive is gone (removed by hand, or a crash between unpack and cleanup): fetch again
            self.update.state = DOWNLOADING
            self._save()
            return
        unpacked = self.state_dir / "versions" / offer.version_id
        if lora.is_adapter_package(unpacked):
            try:  # an adapter without its base on this device never goes further
                lora.check_fits(unpacked, self._current_dir())
            except IncompatibleModel as exc:
                shutil.rmtree(unpacked, ignore_errors=True)  # refused for good: its files go now
                self._refuse(offer, "verify", str(exc), code=IncompatibleModel.reason)
                return
        self._transition("verified", counter=offer.counter)

    def _step_staged(self) -> None:
        offer = self.update.current_offer
        if offer.download_only:
            return  # fetched and verified; a later offer without the flag activates it
        if offer.window and not _window_open(offer.window):
            return
        self._transition("activate", previous=self.installer.current_version(), attempts=0)

    def _step_switching(self) -> None:
        offer = self.update.current_offer
        if self.update.attempts >= MAX_HEALTH_ATTEMPTS:
            reason = (
                f"crash loop: the agent died {self.update.attempts} times while checking "
                f"{offer.version_label or offer.version_id}"
            )
            self._roll_back(reason, "health", "crash_loop")
            return
        directory = self.state_dir / "versions" / offer.version_id
        if lora.is_adapter_package(directory):
            self._install_adapter(offer, directory)
            return
        self.installer.switch_to(offer.version_id)
        self._maybe_pause("switched")
        try:
            health_check(directory)
        except ActivationError as exc:
            self._roll_back(str(exc), "health")
            return
        running = self.running()
        if offer.rollback and running.get("version_id") != offer.version_id:
            self._drop_rolled_back_adapter(running.get("version_id", ""))
        previous = (
            {k: running.get(k) for k in ("version_id", "package_digest", "counter")}
            if running.get("version_id") == self.update.previous
            else {"version_id": self.update.previous, "package_digest": "", "counter": 0}
        )
        write_json_atomic(
            self.running_file,
            {
                "version_id": offer.version_id,
                "package_digest": offer.package_digest,
                "counter": self.update.counter,
                "previous": previous,
            },
        )
        self.installer.part_file(offer).unlink(missing_ok=True)
        self.on_version_change(offer.version_id)
        self._report_ok(offer, self.update.previous, "health", self.update.counter)
        log.info("now running %s:%s", offer.model_name, offer.version_label)
        self._transition("healthy", attempts=0, probation_until=time.time() + self.probation_seconds)

    def _install_adapter(self, offer: Offer, directory: Path) -> None:
        """Switching, for an adapter: checked against the active base (which may have changed
        while it was staged), loaded, then added beside the base; `current` stays."""
        try:
            lora.install(
                self.adapters, directory, self._current_dir(), offer.version_id, offer.package_digest
            )
        except ActivationError as exc:
            self._roll_back(str(exc), "health", getattr(exc, "reason", "health_check_failed"))
            return
        before = self.running().get("version_id", "")
        self._commit_running(offer, self.update.counter)
        self.installer.part_file(offer).unlink(missing_ok=True)
        self.on_version_change(self.installer.current_version())
        self._report_ok(offer, before, "health", self.update.counter)
        self._transition("healthy", attempts=0, probation_until=time.time() + self.probation_seconds)

    def _report_ok(self, offer: Offer, before: str, stage: str, counter: int) -> None:
        self.report(
            "activation",
            {
                "ok": True,
                "version_id": offer.version_id,
                "from": before,
                "reason": "rollback" if offer.rollback else "update",
                "stage": stage,
                "counter": counter,
            },
            offer.version_id,
        )

    def _step_probation(self) -> None:
        if self.update.attempts >= self.crash_loop_starts:
            offer = self.update.current_offer
            self._roll_back(
                f"crash loop: the agent restarted {self.update.attempts} times within "
                f"{self.probation_seconds:.0f} s of activating {offer.version_label or offer.version_id}",
                "probation",
                "crash_loop",
            )
            return
        if time.time() >= self.update.probation_until:
            self.adapters.settle()
            forgotten = self.adapters.forget_other_bases(lora.llm_base_digest(self._current_dir()))
            if forgotten:
                log.info("adapters %s dropped: bound to another base", ", ".join(forgotten))
            removed = self.installer.prune(keep=self.adapters.version_ids())
            if removed:
                log.info("pruned old versions %s", ", ".join(removed))
            self._transition("stable")

    def _step_rolling_back(self) -> None:
        offer = self.update.current_offer
        previous = self.update.previous
        self.installer.switch_back(previous)
        running = self.running()
        failed_adapter = self.adapters.by_version(offer.version_id)
        restored = self.adapters.roll_back(offer.version_id, self._adapter_restorable)
        if running.get("version_id") == offer.version_id:  # it was committed (probation): un-commit it
            before = running.get("previous") or {}
            back_to = restored.version_id if restored else previous
            write_json_atomic(
                self.running_file,
                {
                    "version_id": back_to,
                    "package_digest": before.get("package_digest", "")
                    if before.get("version_id") == back_to
                    else "",
                    "counter": before.get("counter", 0),
                    "previous": {},
                },
            )
        if restored is not None:
            log.error(
                "adapter %s: %s failed, %s serves again", restored.name, offer.version_id, restored.version_id
            )
        elif failed_adapter is not None:  # roll_back removed it
            log.error("adapter %s removed: it failed after it was installed", offer.version_id)
        self.on_version_change(previous)
        self.installer.discard(offer)
        # the failed version's files go; current, previous and the installed adapters stay
        self.installer.prune(keep=self.adapters.version_ids())
        self._transition("rolled_back")
        log.error("rolled back to %s after %s failed", previous or "nothing", offer.version_id)

    def _adapter_restorable(self, adapter: lora.InstalledAdapter) -> bool:
        return lora.can_serve_again(adapter, self.state_dir / "versions", self._current_dir())

    def _rollback_target(self, offer: Offer) -> str:
        """What a failed offer goes back to: the adapter it replaced, else the previous version."""
        before = self.adapters.replaced_by(offer.version_id)
        return before.version_id if before and self._adapter_restorable(before) else self.update.previous

    # --- failures ---------------------------------------------------------------------------
    def _roll_back(self, reason: str, stage: str, code: str = "health_check_failed") -> None:
        offer = self.update.current_offer
        self.refusals.remember(offer, reason, None)
        self.report(
            "activation",
            {
                "ok": False,
                "version_id": offer.version_id,
                "reason": reason,
                "stage": stage,
                "code": code,
                "rolled_back_to": self._rollback_target(offer),
            },
            self.update.previous,
        )
        event = "crash_loop" if self.update.state == PROBATION else "unhealthy"
        self._transition(event)
        self._step_rolling_back()

    def _refuse(
        self, offer: Offer, stage: str, reason: str, retry_after: float | None = None, code: str = ""
    ) -> None:
        log.error("update to %s refused at %s: %s", offer.version_label or offer.version_id, stage, reason)
        self.installer.discard(offer)
        self.refusals.remember(offer, reason, retry_after)
        self._report_refusal(offer.version_id, stage, reason, code or stage)
        self._transition("refused")

    def _report_refusal(self, version_id: str, stage: str, reason: str, code: str) -> None:
        self.report(
            "activation",
            {
                "ok": False,
                "version_id": version_id,
                "reason": reason,
                "stage": stage,
                "code": code,
                "refused": True,
            },
            self.installer.current_version(),
        )


def _window_open(window: dict[str, Any]) -> bool:
    from deploy.windows import MaintenanceWindow

    return MaintenanceWindow.from_dict(window).is_open(datetime.now(UTC))
