from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceAttributes(_message.Message):
    __slots__ = ("hardware", "os", "agent_version", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    hardware: str
    os: str
    agent_version: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, hardware: _Optional[str] = ..., os: _Optional[str] = ..., agent_version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EnrolRequest(_message.Message):
    __slots__ = ("token", "name", "attributes", "csr")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CSR_FIELD_NUMBER: _ClassVar[int]
    token: str
    name: str
    attributes: DeviceAttributes
    csr: bytes
    def __init__(self, token: _Optional[str] = ..., name: _Optional[str] = ..., attributes: _Optional[_Union[DeviceAttributes, _Mapping]] = ..., csr: _Optional[bytes] = ...) -> None: ...

class EnrolGrant(_message.Message):
    __slots__ = ("device_id", "organisation_id", "client_certificate", "release_public_keys", "checkin_interval_seconds")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    ORGANISATION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PUBLIC_KEYS_FIELD_NUMBER: _ClassVar[int]
    CHECKIN_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    organisation_id: str
    client_certificate: bytes
    release_public_keys: _containers.RepeatedScalarFieldContainer[bytes]
    checkin_interval_seconds: int
    def __init__(self, device_id: _Optional[str] = ..., organisation_id: _Optional[str] = ..., client_certificate: _Optional[bytes] = ..., release_public_keys: _Optional[_Iterable[bytes]] = ..., checkin_interval_seconds: _Optional[int] = ...) -> None: ...

class EnrolResponse(_message.Message):
    __slots__ = ("grant", "signature")
    GRANT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    grant: bytes
    signature: bytes
    def __init__(self, grant: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("csr",)
    CSR_FIELD_NUMBER: _ClassVar[int]
    csr: bytes
    def __init__(self, csr: _Optional[bytes] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("client_certificate",)
    CLIENT_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    client_certificate: bytes
    def __init__(self, client_certificate: _Optional[bytes] = ...) -> None: ...

class CheckInRequest(_message.Message):
    __slots__ = ("attributes", "running_version_id", "running_package_digest", "update", "held_assignment_counter", "hinted", "key_rotation_sequence")
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_PACKAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    HELD_ASSIGNMENT_COUNTER_FIELD_NUMBER: _ClassVar[int]
    HINTED_FIELD_NUMBER: _ClassVar[int]
    KEY_ROTATION_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    attributes: DeviceAttributes
    running_version_id: str
    running_package_digest: str
    update: UpdateStatus
    held_assignment_counter: int
    hinted: bool
    key_rotation_sequence: int
    def __init__(self, attributes: _Optional[_Union[DeviceAttributes, _Mapping]] = ..., running_version_id: _Optional[str] = ..., running_package_digest: _Optional[str] = ..., update: _Optional[_Union[UpdateStatus, _Mapping]] = ..., held_assignment_counter: _Optional[int] = ..., hinted: _Optional[bool] = ..., key_rotation_sequence: _Optional[int] = ...) -> None: ...

class UpdateStatus(_message.Message):
    __slots__ = ("state", "version_id", "release_id", "assignment_counter", "reason_code", "message", "at")
    STATE_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_COUNTER_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    state: str
    version_id: str
    release_id: str
    assignment_counter: int
    reason_code: str
    message: str
    at: float
    def __init__(self, state: _Optional[str] = ..., version_id: _Optional[str] = ..., release_id: _Optional[str] = ..., assignment_counter: _Optional[int] = ..., reason_code: _Optional[str] = ..., message: _Optional[str] = ..., at: _Optional[float] = ...) -> None: ...

class PackageOffer(_message.Message):
    __slots__ = ("release_id", "version_id", "version_label", "model_name", "package_digest", "package_size", "download_only", "rollback", "window", "assignment", "assignment_signature")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_LABEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_ONLY_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    version_id: str
    version_label: str
    model_name: str
    package_digest: str
    package_size: int
    download_only: bool
    rollback: bool
    window: MaintenanceWindow
    assignment: bytes
    assignment_signature: bytes
    def __init__(self, release_id: _Optional[str] = ..., version_id: _Optional[str] = ..., version_label: _Optional[str] = ..., model_name: _Optional[str] = ..., package_digest: _Optional[str] = ..., package_size: _Optional[int] = ..., download_only: _Optional[bool] = ..., rollback: _Optional[bool] = ..., window: _Optional[_Union[MaintenanceWindow, _Mapping]] = ..., assignment: _Optional[bytes] = ..., assignment_signature: _Optional[bytes] = ...) -> None: ...

class MaintenanceWindow(_message.Message):
    __slots__ = ("cron", "duration_seconds", "timezone")
    CRON_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    cron: str
    duration_seconds: int
    timezone: str
    def __init__(self, cron: _Optional[str] = ..., duration_seconds: _Optional[int] = ..., timezone: _Optional[str] = ...) -> None: ...

class CheckInResponse(_message.Message):
    __slots__ = ("checkin_interval_seconds", "desired", "key_rotation", "desired_unchanged", "key_rotation_chain", "key_rotation_refused")
    CHECKIN_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    KEY_ROTATION_FIELD_NUMBER: _ClassVar[int]
    DESIRED_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    KEY_ROTATION_CHAIN_FIELD_NUMBER: _ClassVar[int]
    KEY_ROTATION_REFUSED_FIELD_NUMBER: _ClassVar[int]
    checkin_interval_seconds: int
    desired: PackageOffer
    key_rotation: KeyRotation
    desired_unchanged: bool
    key_rotation_chain: _containers.RepeatedCompositeFieldContainer[KeyRotation]
    key_rotation_refused: str
    def __init__(self, checkin_interval_seconds: _Optional[int] = ..., desired: _Optional[_Union[PackageOffer, _Mapping]] = ..., key_rotation: _Optional[_Union[KeyRotation, _Mapping]] = ..., desired_unchanged: _Optional[bool] = ..., key_rotation_chain: _Optional[_Iterable[_Union[KeyRotation, _Mapping]]] = ..., key_rotation_refused: _Optional[str] = ...) -> None: ...

class KeyRotation(_message.Message):
    __slots__ = ("rotation", "signature")
    ROTATION_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    rotation: bytes
    signature: bytes
    def __init__(self, rotation: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("package_digest", "offset")
    PACKAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    package_digest: str
    offset: int
    def __init__(self, package_digest: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class PackageChunk(_message.Message):
    __slots__ = ("offset", "data", "total_size")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    total_size: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_size: _Optional[int] = ...) -> None: ...

class TelemetryRecord(_message.Message):
    __slots__ = ("seq", "kind", "timestamp", "version_id", "payload_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: str
    timestamp: float
    version_id: str
    payload_json: str
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[str] = ..., timestamp: _Optional[float] = ..., version_id: _Optional[str] = ..., payload_json: _Optional[str] = ...) -> None: ...

class TelemetryBatch(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[TelemetryRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[TelemetryRecord, _Mapping]]] = ...) -> None: ...

class TelemetryAck(_message.Message):
    __slots__ = ("stored_seqs", "duplicate_seqs", "rejected")
    STORED_SEQS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_SEQS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    stored_seqs: _containers.RepeatedScalarFieldContainer[int]
    duplicate_seqs: _containers.RepeatedScalarFieldContainer[int]
    rejected: _containers.RepeatedCompositeFieldContainer[RejectedRecord]
    def __init__(self, stored_seqs: _Optional[_Iterable[int]] = ..., duplicate_seqs: _Optional[_Iterable[int]] = ..., rejected: _Optional[_Iterable[_Union[RejectedRecord, _Mapping]]] = ...) -> None: ...

class RejectedRecord(_message.Message):
    __slots__ = ("seq", "reason")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    reason: str
    def __init__(self, seq: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("running_version_id",)
    RUNNING_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    running_version_id: str
    def __init__(self, running_version_id: _Optional[str] = ...) -> None: ...

class Hint(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...
