"""The control plane's Ed25519 release key, kept in one file (FERRY_RELEASE_KEY_FILE).

Created once, atomically, by whichever process needs it first; devices receive the
public half when they enrol and trust only packages it signed.  ``rotate_release_key`` replaces
it: the new key set is signed by the old key (deploy.trust.rotation), kept next to the key file
and sent to every device at check-in; the old key is kept as ``<key file>.<sequence>.retired``.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

from django.conf import settings

from deploy.package import generate_keypair, public_key_of
from deploy.trust.rotation import MAX_KEYS, KeyRotation, sign_rotation


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


# Every check-in answer carries the rotation, so each process keeps the parsed file. Owner: this
# module. Invalidation: the file's identity (a rotation replaces it by rename, so inode and mtime
# change), checked with one stat per call instead of an open, a read and a JSON parse.
_rotation_cache: dict[str, tuple[tuple[int, int, int], tuple[bytes, bytes]]] = {}


def current_rotation() -> tuple[bytes, bytes] | None:
    """(rotation bytes, signature by the previous key) of the latest rotation, or None."""
    path = _rotation_path_text()  # a string and os.stat: pathlib costs more than the stat itself
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    cached = _rotation_cache.get(path)
    if cached is not None and cached[0] == identity:
        return cached[1]
    saved = json.loads(Path(path).read_text())
    rotation = base64.b64decode(saved["rotation"]), base64.b64decode(saved["signature"])
    _rotation_cache[path] = (identity, rotation)
    return rotation


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
    body = {"rotation": base64.b64encode(blob).decode(), "signature": base64.b64encode(signature).decode()}
    _write_atomic(_rotation_path(), json.dumps(body).encode())
    _write_atomic(key_path, new.private_key)
    return rotation


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(generate_keypair().private_key)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # fails if another process won the race; its key is kept
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
