"""The control plane's Ed25519 release key, kept in one file (FERRY_RELEASE_KEY_FILE).

Created once, atomically, by whichever process needs it first; devices receive the
public half when they enrol and trust only packages it signed.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from deploy.package import generate_keypair, public_key_of


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
