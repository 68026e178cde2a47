"""The no-change check-in, answered from memory: no SQL, no Redis call, nothing recomputed.

After a computed check-in the gateway remembers, per device (the id its verified client
certificate names), what it answered and what the answer was computed from: the
organisation's fleet generation, the attributes and running version the device reported, its
update status (the UpdateStatus bytes), the device row's own facts and the signed
assignment's counter.  The device's next check-in is answered from memory when

- its organisation's generation in this process's view (gateway.desired_cache) is the same,
  and the view is fresh: the refresher read it, and the revoked-device feed, less than
  STALE_SECONDS ago (a hinted check-in reads its generation afresh, as its hint may be newer);
- the device reports the same attributes, running version and update status;
- the answer is still valid (its assignment has more than half its lifetime left, and
  MAX_AGE_SECONDS whatever happens);

and the device was not revoked since (gateway.revocations: at once in the revoking process,
within a refresher tick in the others).  Anything else computes the answer and remembers the
new one.  When the device says it holds the very assignment of the answer
(CheckInRequest.held_assignment_counter, which the agent sends once that assignment needs
nothing more from it), the answer is desired_unchanged instead of the same bytes again.

last_seen_at is noted for gateway.last_seen's batch, which the refresher writes once a second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from django.db import connection
from fleet.models import Device
from fleet.services import LAST_SEEN_RESOLUTION

from deploy.proto import agent_pb2
from gateway.desired_cache import fleet_generation, generations
from gateway.last_seen import LastSeenBatch
from gateway.revocations import RevocationFeed, on_revoked

log = logging.getLogger(__name__)
REFRESH_SECONDS = 0.25
STALE_SECONDS = 1.0  # revocations reach every gateway within this, or it stops answering from memory
LAST_SEEN_FLUSH_SECONDS = 1.0
MAX_AGE_SECONDS = 600.0
MAX_ENTRIES = 200_000
_RESOLUTION = LAST_SEEN_RESOLUTION.total_seconds()


def device_facts(device: Device) -> int:
    """What the device row adds to the answer besides the fleet, as a hash (a remembered device
    costs less memory): compared by computed check-ins, so one that only moves the update status
    reuses the answer. A collision could only ever reuse that same device's own answer."""
    return hash(
        (
            device.running_version_id,
            device.pinned_version_id,
            json.dumps(device.attributes or {}, sort_keys=True),
            json.dumps(device.labels or {}, sort_keys=True),
        )
    )


def reported(request: agent_pb2.CheckInRequest) -> tuple[str, str, str, str, bytes, int]:
    """What a check-in reports, as sent: attributes, running version, update status and the
    release-key rotation held (a change is stored on the device row, so it is computed)."""
    a = request.attributes
    update = request.update.SerializeToString() if request.HasField("update") else b""
    return (
        a.hardware,
        a.os,
        a.agent_version,
        request.running_version_id,
        update,
        request.key_rotation_sequence,
    )


@dataclass(slots=True)
class Known:
    """One device's remembered answer and what it was computed from."""

    organisation_id: int
    generation: int
    reported: tuple[str, str, str, str, bytes, int]
    facts: int
    offer: bytes | None  # a serialized PackageOffer; None: nothing decided for the device
    counter: int  # the offer's assignment counter (0: none)
    valid_until: float  # epoch seconds
    last_seen: float  # epoch seconds: last_seen_at as last written or noted


@dataclass(frozen=True)
class Answer:
    """A computed answer, for answer_with and remember."""

    offer: bytes | None
    counter: int
    valid_until: float


def answer_with(
    response: agent_pb2.CheckInResponse, answer: Answer, request: agent_pb2.CheckInRequest
) -> agent_pb2.CheckInResponse:
    if answer.offer is None:
        return response
    if answer.counter and request.held_assignment_counter == answer.counter:
        response.desired_unchanged = True
    else:
        response.desired.MergeFromString(answer.offer)
    return response


class KnownDevices:
    """device id -> Known, for one servicer; thread-safe for the gateway's worker threads."""

    def __init__(self, interval_seconds: int, max_entries: int = MAX_ENTRIES) -> None:
        self.interval_seconds = interval_seconds
        self.max_entries = max_entries
        self._known: dict[str, Known] = {}
        self._lock = threading.Lock()
        self.epoch = 0  # how many revocations this has heard of: see remember()
        on_revoked(self)

    def __len__(self) -> int:
        return len(self._known)

    def organisation_of(self, device_id: str | None) -> int | None:
        """The organisation of a device seen before (it never changes); None for a new one."""
        known = self._known.get(device_id) if device_id else None
        return known.organisation_id if known is not None else None

    def answer(self, device_id: str, request: agent_pb2.CheckInRequest) -> agent_pb2.CheckInResponse | None:
        """The check-in's response from memory; None when it must be computed."""
        known = self._known.get(device_id)
        if known is None or not refresher.fresh():
            return None
        now = time.time()
        if now >= known.valid_until or reported(request) != known.reported:
            return None
        if request.hinted:  # the hint may be newer than this process's view
            generation = fleet_generation(known.organisation_id)
        else:
            generation = generations.current(known.organisation_id)
        if generation != known.generation:
            return None
        if now - known.last_seen >= _RESOLUTION:
            known.last_seen = now
            refresher.last_seen.seen(device_id, now)
        response = agent_pb2.CheckInResponse(checkin_interval_seconds=self.interval_seconds)
        if known.offer is None:
            return response
        if known.counter and request.held_assignment_counter == known.counter:
            response.desired_unchanged = True
        else:
            response.desired.MergeFromString(known.offer)
        return response

    def reusable(self, device: Device, generation: int | None) -> Answer | None:
        """A computed check-in's answer if the remembered one was computed from the same facts."""
        known = self._known.get(str(device.pk))
        if (
            known is None
            or generation is None
            or known.generation != generation
            or known.facts != device_facts(device)
            or time.time() >= known.valid_until
        ):
            return None
        return Answer(known.offer, known.counter, known.valid_until)

    def remember(
        self,
        device: Device,
        request: agent_pb2.CheckInRequest,
        generation: int | None,
        answer: Answer,
        epoch: int,
    ) -> None:
        """Keep a computed answer; ``epoch`` is self.epoch read before the device row was, so a
        revocation heard meanwhile (its device may be this one) keeps the answer out."""
        if generation is None:
            return
        now = time.time()
        known = Known(
            organisation_id=device.organisation_id,
            generation=generation,
            reported=reported(request),
            facts=device_facts(device),
            offer=answer.offer,
            counter=answer.counter,
            valid_until=min(answer.valid_until, now + MAX_AGE_SECONDS),
            last_seen=device.last_seen_at.timestamp() if device.last_seen_at else now,
        )
        with self._lock:
            if self.epoch != epoch:
                return
            if len(self._known) >= self.max_entries:
                self._known.clear()  # simplest bound: a full memory starts over
            self._known[str(device.pk)] = known
        refresher.ensure_running()

    def forget(self, device_id: str) -> None:
        with self._lock:
            self.epoch += 1
            self._known.pop(device_id, None)


class _Refresher:
    """One thread per process: re-reads the fleet generations and the revoked-device feed every
    REFRESH_SECONDS, and writes the last_seen_at batch every LAST_SEEN_FLUSH_SECONDS."""

    def __init__(self) -> None:
        self.last_seen = LastSeenBatch()
        self._feed = RevocationFeed()
        self._ok_at = float("-inf")  # monotonic start of the last tick that read both
        self._flushed_at = 0.0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def fresh(self) -> bool:
        return time.monotonic() - self._ok_at < STALE_SECONDS

    def ensure_running(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self.tick(flush=False)  # the first answers from memory need a fresh view, not one a tick away
            self._thread = threading.Thread(target=self._run, name="checkin-refresher", daemon=True)
            self._thread.start()

    def tick(self, flush: bool = True) -> None:
        started = time.monotonic()
        ok = generations.refresh()
        revoked = self._feed.poll()
        if revoked is None:
            ok = False
        else:
            from gateway.revocations import forget_everywhere

            for device_id in revoked:
                forget_everywhere(device_id)
        if ok:
            self._ok_at = started
        if flush and started - self._flushed_at >= LAST_SEEN_FLUSH_SECONDS:
            self._flushed_at = started
            self._flush()

    def _flush(self) -> None:
        try:
            if self.last_seen.pending():
                self.last_seen.flush()
            else:
                connection.close()  # idle: hold no database session
        except Exception:  # a bug here must not stop the refresher (and with it the fast path)
            log.exception("last_seen_at batch failed")

    def _run(self) -> None:
        while True:
            time.sleep(REFRESH_SECONDS)
            try:
                self.tick()
            except Exception:  # logged; the fast path goes stale (computed answers) until the next tick
                log.exception("check-in refresher tick failed")


refresher = _Refresher()
