"""The control plane's Ed25519 release key, kept in one file (FERRY_RELEASE_KEY_FILE).

Created once, atomically, by whichever process needs it first; devices receive the
public half when they enrol and trust only packages it signed.  ``rotate_release_key`` replaces
it: the new key set is signed by the old key (deploy.trust.rotation), kept next to the key file
with every earlier rotation (the chain: small, signed, public) and sent to devices at check-in,
each the rotations above the one it holds; the old key is kept as ``<key file>.<sequence>.retired``.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
from pathlib import Path

from django.conf import settings

from deploy.package import generate_keypair, public_key_of
from deploy.trust.rotation import MAX_CHAIN, MAX_KEYS, KeyRotation, sign_rotation

Link = tuple[bytes, bytes]  # (rotation bytes, signature by the previous key set)


def release_private_key() -> bytes:
    path = Path(settings.FERRY_RELEASE_KEY_FILE)
    if not path.exists():
        _create(path)
    key = path.read_bytes()
    if len(key) != 32:
        raise RuntimeError(f"{path} must hold a raw 32-byte Ed25519 private key, it holds {len(key)} bytes")
    return key


def release_public_key() -> bytes:
    return public_key_of(release_private_key())


def _rotation_path() -> Path:
    key = Path(settings.FERRY_RELEASE_KEY_FILE)
    return key.with_name(f"{key.name}.rotation.json")


_rotation_paths: dict[str, str] = {}  # key file -> its rotation file, as a string (built once)


def _rotation_path_text() -> str:
    key = str(settings.FERRY_RELEASE_KEY_FILE)
    path = _rotation_paths.get(key)
    if path is None:
        path = _rotation_paths[key] = str(_rotation_path())
    return path


# Every check-in answer carries rotations, so each process keeps the parsed file. Owner: this
# module. Invalidation: the file's identity (a rotation replaces it by rename, so inode and mtime
# change), checked with one stat per call instead of an open, a read and a JSON parse.
_rotation_cache: dict[str, tuple[tuple[int, int, int], list[tuple[int, Link]]]] = {}


def _chain() -> list[tuple[int, Link]]:
    """Every rotation so far, oldest first, with its sequence; [] before the first."""
    path = _rotation_path_text()  # a string and os.stat: pathlib costs more than the stat itself
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return []
    identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    cached = _rotation_cache.get(path)
    if cached is not None and cached[0] == identity:
        return cached[1]
    saved = json.loads(Path(path).read_text())
    # a file written before chains were kept holds the latest rotation only
    links = saved.get("chain") or [{"rotation": saved["rotation"], "signature": saved["signature"]}]
    chain = []
    for link in links:
        blob = base64.b64decode(link["rotation"])
        chain.append((json.loads(blob)["sequence"], (blob, base64.b64decode(link["signature"]))))
    _rotation_cache[path] = (identity, chain)
    return chain


def current_rotation() -> Link | None:
    """(rotation bytes, signature by the previous key) of the latest rotation, or None."""
    chain = _chain()
    return chain[-1][1] if chain else None


def current_sequence() -> int:
    """The latest rotation's sequence; 0 if the release key was never rotated."""
    chain = _chain()
    return chain[-1][0] if chain else 0


def rotations_after(sequence: int) -> tuple[list[Link], bool]:
    """(the rotations above ``sequence``, oldest first, at most MAX_CHAIN, the latest ones; whether
    more were left out: a device that far behind cannot catch up and must be enrolled again)."""
    chain = _chain()
    if not chain or chain[-1][0] <= sequence:
        return [], False
    above = [link for seq, link in chain if seq > sequence]
    return above[-MAX_CHAIN:], len(above) > MAX_CHAIN


def release_key_status(held_sequence: int, latest_sequence: int) -> str:
    """How a device holding rotation ``held_sequence`` stands: current, behind (it catches up
    through the chain at its next check-in) or reenrol_required (more than a chain behind)."""
    if held_sequence >= latest_sequence:
        return "current"
    return "reenrol_required" if latest_sequence - held_sequence > MAX_CHAIN else "behind"


def trusted_public_keys() -> list[bytes]:
    """The release keys a device should trust now: the latest rotation's set, else the one key."""
    rotation = current_rotation()
    if rotation is None:
        return [release_public_key()]
    return [bytes.fromhex(k) for k in json.loads(rotation[0])["keys"]]


def rotate_release_key(now: float | None = None, *, retire_previous: bool = False) -> KeyRotation:
    """Make a new release key and the rotation to it, signed by the key devices trust now.

    By default the keys trusted so far stay in the set (packages are signed once, at conversion,
    so earlier versions stay installable); ``retire_previous`` trusts only the new key, for a
    leaked key, after which earlier versions must be converted again.  The rotation is written
    before the key file is replaced, so a crash in between leaves devices trusting a key that is
    not yet signing anything, never the other way round.
    """
    old = release_private_key()
    previous = current_rotation()
    if previous is None:
        sequence, trusted = 1, [public_key_of(old)]
    else:
        saved = json.loads(previous[0])
        sequence, trusted = saved["sequence"] + 1, [bytes.fromhex(k) for k in saved["keys"]]
    new = generate_keypair()
    keys = (new.public_key,) if retire_previous else (new.public_key, *trusted)[:MAX_KEYS]
    rotation = KeyRotation(keys=keys, sequence=sequence, issued_at=int(now or time.time()))
    blob, signature = sign_rotation(rotation, old)
    key_path = Path(settings.FERRY_RELEASE_KEY_FILE)
    _write_atomic(key_path.with_name(f"{key_path.name}.{sequence}.retired"), old)
    links = [(link_blob, link_signature) for _, (link_blob, link_signature) in _chain()]
    links.append((blob, signature))
    chain = [{"rotation": _b64(b), "signature": _b64(s)} for b, s in links]
    body = {"rotation": _b64(blob), "signature": _b64(signature), "chain": chain}
    _write_atomic(_rotation_path(), json.dumps(body).encode())
    _write_atomic(key_path, new.private_key)
    return rotation


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _synced_temp(path: Path, data: bytes) -> Path:
    """data in a new file beside path (mode 0600, on disk): a unique name per call, since the
    gateway's threads and several processes may create the key at once."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(name)


def _write_atomic(path: Path, data: bytes) -> None:
    os.replace(_synced_temp(path, data), path)


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _synced_temp(path, generate_keypair().private_key)
    try:
        os.link(tmp, path)  # fails if another process won the race; its key is kept
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
