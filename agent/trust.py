"""What this device accepts as an instruction: a signed assignment (deploy.trust.assignment).

The gateway's offer carries display fields and the signed assignment; only the assignment is
trusted.  The highest accepted counter lives in ``assignment.json`` in the state directory,
written atomically (temp file, fsync, rename) before the device acts on the assignment, so a
restart never lets an older assignment back in; the same assignment seen again (at the next
check-in, or after a restart) is accepted, as it names the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from agent.files import read_json, write_json_atomic
from deploy.trust.assignment import Assignment, AssignmentMalformed, blob_sha256, verify_assignment
from deploy.trust.rotation import (
    KeyRotation,
    RotationBadSignature,
    RotationMalformed,
    unverified_rotation,
    verify_chain,
)

MAX_DISPLAY_CHARS = 200


@dataclass(frozen=True)
class SignedOffer:
    """An offer as it arrives: the signed assignment and the gateway's (untrusted) display names."""

    assignment: bytes
    signature: bytes
    version_label: str = ""
    model_name: str = ""

    @property
    def sha256(self) -> str:
        return blob_sha256(self.assignment)


def display_text(value: str) -> str:
    """A display string from the gateway, bounded and single-line (it is shown, never used)."""
    return "".join(c for c in str(value)[:MAX_DISPLAY_CHARS] if c.isprintable())


@dataclass
class AssignmentTrust:
    state_dir: Path
    trusted_keys: list[bytes]
    device_id: str
    organisation_id: str

    @property
    def path(self) -> Path:
        return self.state_dir / "assignment.json"

    def last(self) -> tuple[int, str]:
        """(highest accepted counter, sha256 of that assignment's bytes)."""
        try:
            data = read_json(self.path, {}) or {}
        except ValueError:
            data = {"counter": None}
        counter, sha256 = data.get("counter", 0), data.get("sha256", "")
        if not isinstance(counter, int) or not isinstance(sha256, str):
            raise AssignmentMalformed(f"{self.path} is damaged; refusing every assignment until it is fixed")
        return counter, sha256

    def accept(self, offer: SignedOffer, now: float | None = None) -> Assignment:
        """Verify and record the assignment (AssignmentRefused and its code if refused)."""
        counter, sha256 = self.last()
        assignment = verify_assignment(
            offer.assignment,
            offer.signature,
            self.trusted_keys,
            device_id=self.device_id,
            organisation_id=self.organisation_id,
            last_counter=counter,
            last_sha256=sha256,
            now=time.time() if now is None else now,
        )
        if assignment.counter != counter:
            write_json_atomic(self.path, {"counter": assignment.counter, "sha256": offer.sha256})
        return assignment


@dataclass
class ReleaseKeys:
    """The release keys this device trusts: the enrolment grant's, until a signed rotation.

    A rotation (deploy.trust.rotation) is taken only if a key trusted now signed it and its
    sequence is above the last one taken; the new set and sequence go to ``release_keys.json``
    atomically before they are used.  ``keys`` is one list, updated in place, so everything
    holding it (assignment trust) sees the new set at once.
    """

    state_dir: Path
    keys: list[bytes]
    sequence: int = 0
    sha256: str = ""
    # the sequence of a rotation recognised as naming exactly our keys (enrolled after it): in
    # memory only, reported to the gateway so it stops sending the chain up to it; never trusted
    recognised_sequence: int = 0

    @property
    def reported_sequence(self) -> int:
        """The rotation sequence this device tells the gateway it holds."""
        return max(self.sequence, self.recognised_sequence)

    @property
    def path(self) -> Path:
        return self.state_dir / "release_keys.json"

    @classmethod
    def load(cls, state_dir: Path, enrolled_keys: list[bytes]) -> ReleaseKeys:
        path = state_dir / "release_keys.json"
        try:
            saved = read_json(path)
            if saved is None:
                return cls(state_dir, list(enrolled_keys))
            keys = [bytes.fromhex(k) for k in saved["keys"]]
            sequence, sha256 = saved["sequence"], saved["sha256"]
        except (ValueError, KeyError, TypeError):
            keys, sequence, sha256 = [], None, None
        if (
            not keys
            or any(len(k) != 32 for k in keys)
            or not isinstance(sequence, int)
            or not isinstance(sha256, str)
        ):
            # never fall back to the enrolment keys: that would undo a rotation away from a leaked key
            raise RotationMalformed(f"{path} is damaged; re-enrol this device or restore the file")
        return cls(state_dir, keys, sequence, sha256)

    def take(self, blob: bytes, signature: bytes) -> KeyRotation | None:
        """Apply one rotation (a chain of one); None if already taken, RotationRefused if refused."""
        rotations = self.take_chain([(blob, signature)])
        return rotations[-1] if rotations else None

    def take_chain(self, links: list[tuple[bytes, bytes]]) -> list[KeyRotation]:
        """Apply every rotation the gateway sent, in order: all of them durably, or none.

        [] if there was nothing new; RotationRefused (and nothing changed) if any link is refused.
        """
        links = [link for link in links if hashlib.sha256(link[0]).hexdigest() != self.sha256]
        if not links:
            return []
        try:
            rotations = verify_chain(links, list(self.keys), self.sequence)
        except RotationBadSignature:
            links = self._past_our_own_keys(links)
            if links is None:
                raise
            rotations = verify_chain(links, list(self.keys), self.sequence) if links else []
        if not rotations:
            return []
        last, sha256 = rotations[-1], hashlib.sha256(links[-1][0]).hexdigest()
        # one write for the whole chain (temp file, fsync, rename): a crash keeps all or none
        write_json_atomic(
            self.path, {"keys": [k.hex() for k in last.keys], "sequence": last.sequence, "sha256": sha256}
        )
        self.keys[:] = last.keys
        self.sequence, self.sha256 = last.sequence, sha256
        return rotations

    def _past_our_own_keys(self, links: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]] | None:
        """The links after the last one naming exactly the keys we hold (a device enrolled after
        it: signed by a key it never held), remembered in memory only; None if no link does."""
        for index in range(len(links) - 1, -1, -1):
            rotation = unverified_rotation(links[index][0])
            if rotation is not None and rotation.keys == tuple(self.keys):
                self.recognised_sequence = max(self.recognised_sequence, rotation.sequence)
                self.sha256 = hashlib.sha256(links[index][0]).hexdigest()  # quiet at the next check-in
                return links[index + 1 :]
        return None
