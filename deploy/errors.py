"""Why a package or a policy was refused; messages are meant for release managers and device logs."""


class DeployError(Exception):
    """Base class of every error deploy/ raises on purpose."""


class PackageRejected(DeployError):
    """A package must not be installed; the message says why."""


class SignatureError(PackageRejected):
    """The manifest's signature is missing, malformed or made by another key."""


class IntegrityError(PackageRejected):
    """A file does not match the sha256 or size the signed manifest lists, or one is missing."""


class UnsafeArchiveError(PackageRejected):
    """The archive holds something that must never be unpacked: links, absolute paths, `..`, too much."""


class PolicyError(DeployError):
    """A rollout policy is malformed (bad percentage, unknown target field, ...)."""
