"""Small packages for the package library's tests, written through the library itself."""

from __future__ import annotations

from pathlib import Path

from deploy.package import SignedClaims, generate_keypair, sign_package, write_package

KEYS = generate_keypair()
FILES = [("graph.json", b'{"nodes":[]}'), ("weights.bin", bytes(range(256)) * 9)]
INPUTS = [{"name": "x", "dtype": "float32", "shape": [1, 4]}]
OUTPUTS = [{"name": "y", "dtype": "float32", "shape": [1, 4]}]


def unsigned(path: Path, files: list[tuple[str, bytes]] = FILES) -> Path:
    write_package(path, files=files, inputs=INPUTS, outputs=OUTPUTS, metadata={"note": "test"})
    return path


def signed(directory: Path, claims: SignedClaims | None = None) -> Path:
    claims = claims or SignedClaims(organisation="7")
    sign_package(unsigned(directory / "unsigned.ferry"), directory / "signed.ferry", KEYS.private_key, claims)
    return directory / "signed.ferry"
