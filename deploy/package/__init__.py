"""The package container: one library for writing, reading, signing, verifying and unpacking.

Modules: ``manifest`` (what a package lists, the format version), ``writer`` (deterministic
archives, signing a copy), ``reader`` (streaming reads, the safe-path rules), ``signing``
(Ed25519 and the signed claims), ``verify`` (verify-then-unpack in one pass) and ``digest``
(the library's one sha256).  The converter writes through it, the control plane signs and
re-signs through it, the agent verifies and unpacks through it.  It imports nothing of ours
outside deploy/.

Threat model.  A device must run only what the control plane's release key signed, for its
device class, and never older than what it has run.  Everyone between the signer and the
device (the gateway, the object store, the network, a local user who can swap a downloaded
file) may serve any bytes: other packages, old ones, truncated, reordered or hostile archives.
Only the release key is trusted; devices hold its public half.

- What the signature covers: the sha256 of ``manifest.json``'s exact bytes, which lists every
  other file by name with its sha256 and size, the model's inputs and outputs, the format
  version and the metadata (self-test vectors, the stream pipeline); and the claims signed
  with it (``SignedClaims``): a release ``counter`` that only goes up across the organisation,
  the ``device_class`` ("*" for any) and a ``rollback`` flag.  It does not cover the tar
  headers (mtime, mode and owner are ignored; names must match the manifest), nor the
  archive's own sha256, which the offer uses to name and resume a download and, when
  verification refuses an archive, to tell damaged bytes (retried) from a bad package.
- What is verified before anything is written: the first member is ``manifest.json`` and the
  second ``manifest.sig`` (each at most 1 MiB), the Ed25519 signature by the trusted key over
  the manifest's digest and the claims, then the caller's claims check (device class, counter
  not below the highest the device ran) and the listing's limits (entries, total bytes).  Only
  then are files written, each to a new file in a fresh staging directory, hashed as it
  streams and cut off past its listed size; the agent renames the staging directory into
  place and switches to it only after every listed file matched.
- What a device refuses (``PackageRejected`` and its subclasses, the reason reported): no or a
  malformed signature, another key or algorithm, an altered manifest or claims, another device
  class, an older counter (going back needs a rollback re-signed with a newer counter),
  members that are links, devices or directories, absolute or ``..`` or nested paths, members
  not listed or repeated, files larger, smaller or other than listed, missing files, too many
  entries or bytes, an unreadable archive.  Nothing of a refused package stays on disk.
- One pass: the archive is read forward once; the manifest and each file are hashed once.

Not covered here, and the home of the next step, ``deploy/trust/``: which device should run
what, and until when.  Any package signed for a class can be replayed to every device of it
(within the counter), and a gateway can withhold newer packages forever (no expiry).  A signed
per-device assignment (Uptane's director metadata: device id, a per-device counter, an expiry,
and the package's identity) closes that, signed by an online key separate from the release
key.  It should name the manifest's sha256, which this signature already covers and the one
pass already computes, rather than the archive's, so checking it hashes nothing more; the
device would check the assignment, then the package signature, then stream as above.
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
