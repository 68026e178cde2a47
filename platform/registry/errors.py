from ferry_cloud.api_errors import Conflict, ServiceError


class InvalidUpload(ServiceError):
    code = "invalid_upload"


class VersionImmutable(Conflict):
    code = "version_immutable"


class VersionNotReady(Conflict):
    code = "version_not_ready"
