from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceAttributes(_message.Message):
    __slots__ = ("hardware", "os", "agent_version", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: str | None = ..., value: str | None = ...) -> None: ...

    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    hardware: str
    os: str
    agent_version: str
    labels: _containers.ScalarMap[str, str]
    def __init__(
        self,
        hardware: str | None = ...,
        os: str | None = ...,
        agent_version: str | None = ...,
        labels: _Mapping[str, str] | None = ...,
    ) -> None: ...

class EnrolRequest(_message.Message):
    __slots__ = ("token", "name", "attributes")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    token: str
    name: str
    attributes: DeviceAttributes
    def __init__(
        self,
        token: str | None = ...,
        name: str | None = ...,
        attributes: DeviceAttributes | _Mapping | None = ...,
    ) -> None: ...

class EnrolResponse(_message.Message):
    __slots__ = ("device_id", "credential", "release_public_key", "checkin_interval_seconds")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKIN_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    credential: str
    release_public_key: bytes
    checkin_interval_seconds: int
    def __init__(
        self,
        device_id: str | None = ...,
        credential: str | None = ...,
        release_public_key: bytes | None = ...,
        checkin_interval_seconds: int | None = ...,
    ) -> None: ...

class CheckInRequest(_message.Message):
    __slots__ = ("attributes", "running_version_id", "running_package_digest")
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_PACKAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    attributes: DeviceAttributes
    running_version_id: str
    running_package_digest: str
    def __init__(
        self,
        attributes: DeviceAttributes | _Mapping | None = ...,
        running_version_id: str | None = ...,
        running_package_digest: str | None = ...,
    ) -> None: ...

class PackageOffer(_message.Message):
    __slots__ = ("release_id", "version_id", "version_label", "model_name", "package_digest", "package_size")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_LABEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    version_id: str
    version_label: str
    model_name: str
    package_digest: str
    package_size: int
    def __init__(
        self,
        release_id: str | None = ...,
        version_id: str | None = ...,
        version_label: str | None = ...,
        model_name: str | None = ...,
        package_digest: str | None = ...,
        package_size: int | None = ...,
    ) -> None: ...

class CheckInResponse(_message.Message):
    __slots__ = ("checkin_interval_seconds", "desired")
    CHECKIN_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    checkin_interval_seconds: int
    desired: PackageOffer
    def __init__(
        self, checkin_interval_seconds: int | None = ..., desired: PackageOffer | _Mapping | None = ...
    ) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("package_digest", "offset")
    PACKAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    package_digest: str
    offset: int
    def __init__(self, package_digest: str | None = ..., offset: int | None = ...) -> None: ...

class PackageChunk(_message.Message):
    __slots__ = ("offset", "data", "total_size")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    total_size: int
    def __init__(
        self, offset: int | None = ..., data: bytes | None = ..., total_size: int | None = ...
    ) -> None: ...

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
    def __init__(
        self,
        seq: int | None = ...,
        kind: str | None = ...,
        timestamp: float | None = ...,
        version_id: str | None = ...,
        payload_json: str | None = ...,
    ) -> None: ...

class TelemetryBatch(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[TelemetryRecord]
    def __init__(self, records: _Iterable[TelemetryRecord | _Mapping] | None = ...) -> None: ...

class TelemetryAck(_message.Message):
    __slots__ = ("stored_seqs", "duplicate_seqs")
    STORED_SEQS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_SEQS_FIELD_NUMBER: _ClassVar[int]
    stored_seqs: _containers.RepeatedScalarFieldContainer[int]
    duplicate_seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self, stored_seqs: _Iterable[int] | None = ..., duplicate_seqs: _Iterable[int] | None = ...
    ) -> None: ...
