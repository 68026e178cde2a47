"""The registry's own refusals, in the domain error families of ferry_cloud.errors."""

from ferry_cloud.errors import Conflict, Invalid


class InvalidUpload(Invalid):
    code = "invalid_upload"


class VersionImmutable(Conflict):
    code = "version_immutable"


class VersionNotReady(Conflict):
    code = "version_not_ready"


class VersionInUse(Conflict):
    code = "version_in_use"
