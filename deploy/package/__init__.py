"""The package container: one library for writing, reading, signing, verifying and unpacking.

Modules: ``manifest`` (what a package lists, the format version), ``writer`` (deterministic
archives, signing a copy), ``reader`` (streaming reads, the safe-path rules), ``signing``
(Ed25519 and the signed claims), ``verify`` (verify-then-unpack in one pass) and ``digest``
(the library's one sha256).  The converter writes through it, the control plane signs
through it, the agent verifies and unpacks through it.  It imports nothing of ours outside
deploy/.

Threat model.  A device must run only what the control plane's release key signed, for its
device class and its organisation, and only what a signed assignment tells it to run now.
Everyone between the signer and the device (the gateway, the object store, the network, a
local user who can swap a downloaded file) may serve any bytes: other packages, old ones,
truncated, reordered or hostile archives.  Only the release key is trusted; devices hold its
public half.

- What the signature covers (the image role, signed once at conversion): the sha256 of
  ``manifest.json``'s exact bytes, which lists every other file by name with its sha256 and
  size, the model's inputs and outputs, the format version and the metadata (self-test
  vectors, the stream pipeline); and the claims signed with it (``SignedClaims``): the
  ``device_class`` ("*" for any) and the ``organisation`` (tenant id).  It does not cover the
  tar headers (mtime, mode and owner are ignored; names must match the manifest).
- What is verified before anything is written: the first member is ``manifest.json`` and the
  second ``manifest.sig`` (each at most 1 MiB), the Ed25519 signature by the trusted key over
  the manifest's digest and the claims, then the caller's check (device class, organisation,
  the manifest digest the device's assignment names) and the listing's limits (entries, total
  bytes).  Only then are files written, each to a new file in a fresh staging directory,
  hashed as it streams and cut off past its listed size; the agent renames the staging
  directory into place and switches to it only after every listed file matched.
- What a device refuses (``PackageRejected`` and its subclasses, the reason reported): no or a
  malformed signature, another key or algorithm, an altered manifest or claims, another device
  class or organisation, members that are links, devices or directories, absolute or ``..`` or
  nested paths, members not listed or repeated, files larger, smaller or other than listed,
  missing files, too many entries or bytes, an unreadable archive.  Nothing of a refused
  package stays on disk.
- One pass: the archive is read forward once; the manifest and each file are hashed once.

Which device should run what, and until when, is not here but in ``deploy.trust.assignment``:
a per-device assignment (Uptane's director role) signed by the control plane with a counter
that only goes up and an expiry, naming the archive's sha256 and size and the manifest's
sha256.  So rollbacks, re-releases and pins never re-sign a package, and a replayed old
assignment is refused.
"""

from deploy.package.digest import file_sha256
from deploy.package.manifest import (
    FORMAT,
    FORMAT_VERSION,
    GRAPH,
    MANIFEST,
    SIGNATURE,
    WEIGHTS,
    Manifest,
    canonical_json,
    read_unpacked,
)
from deploy.package.reader import read_claims
from deploy.package.signing import (
    ANY_DEVICE_CLASS,
    KeyPair,
    SignedClaims,
    VerifiedManifest,
    generate_keypair,
    key_id,
    public_key_of,
    sign_manifest,
    verify_envelope,
)
from deploy.package.verify import ClaimsCheck, UnpackLimits, VerifiedPackage, verify_and_unpack
from deploy.package.writer import sign_package, write_archive, write_package

__all__ = [
    "ANY_DEVICE_CLASS",
    "FORMAT",
    "FORMAT_VERSION",
    "GRAPH",
    "MANIFEST",
    "SIGNATURE",
    "WEIGHTS",
    "ClaimsCheck",
    "KeyPair",
    "Manifest",
    "SignedClaims",
    "UnpackLimits",
    "VerifiedManifest",
    "VerifiedPackage",
    "canonical_json",
    "file_sha256",
    "generate_keypair",
    "key_id",
    "public_key_of",
    "read_claims",
    "read_unpacked",
    "sign_manifest",
    "sign_package",
    "verify_and_unpack",
    "verify_envelope",
    "write_archive",
    "write_package",
]
