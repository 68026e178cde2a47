"""The version upload's body parser: the size limits are enforced while the body is read.

Django's multipart parser spools each file to a temporary file (past FILE_UPLOAD_MAX_MEMORY_SIZE)
and only then would the service see its size: a 50 GB body would be written out whole first.
Here a declared Content-Length over the limit is refused before a byte is read, and each file's
bytes are counted as they arrive: past its field's limit the upload stops at once, its
temporary file is deleted, and the client gets 413 in the API's error format.
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler
from django.http.multipartparser import MultiPartParser as DjangoMultiPartParser
from django.http.multipartparser import MultiPartParserError
from rest_framework.exceptions import ParseError
from rest_framework.parsers import DataAndFiles, MultiPartParser, get_encoding

# Room for the form's other fields and the multipart boundaries and headers.
FORM_OVERHEAD_BYTES = 1 << 20


class UploadTooLarge(Exception):
    pass


class FieldSizeLimitHandler(FileUploadHandler):
    """Counts each file's bytes as they arrive and stops the request past its field's limit.

    It stores nothing: every chunk goes on to Django's own handlers (memory or temporary file).
    """

    def __init__(self, request=None, *, limits: dict[str, int], default: int) -> None:
        super().__init__(request)
        self.limits, self.default = limits, default
        self.received = 0
        self.limit = default

    def new_file(self, field_name, *args, **kwargs) -> None:
        super().new_file(field_name, *args, **kwargs)
        self.received = 0
        self.limit = self.limits.get(field_name, self.default)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.limit:
            raise UploadTooLarge(
                f"The file in {self.field_name!r} is larger than its limit of {self.limit:,} bytes."
            )
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler makes the file


class SizeLimitedMultiPartParser(MultiPartParser):
    """MultiPartParser with per-field file limits (``limits``) and a bound on the whole body."""

    def __init__(self, limits: dict[str, int] | None = None) -> None:
        self.limits = limits if limits is not None else upload_limits()

    def parse(self, stream, media_type=None, parser_context=None):
        request = parser_context["request"]
        total = sum(self.limits.values()) + FORM_OVERHEAD_BYTES
        declared = request.META.get("CONTENT_LENGTH") or ""
        if declared.isdigit() and int(declared) > total:
            raise _too_large(f"The request body is {int(declared):,} bytes; the limit is {total:,}.")
        counter = FieldSizeLimitHandler(request, limits=self.limits, default=min(self.limits.values()))
        handlers = [counter, *request.upload_handlers]
        meta = {**request.META, "CONTENT_TYPE": media_type}
        try:
            parser = DjangoMultiPartParser(meta, stream, handlers, get_encoding(parser_context))
            return DataAndFiles(*parser.parse())
        except MultiPartParserError as exc:
            raise ParseError(f"Multipart form parse error - {exc}") from None
        except UploadTooLarge as exc:
            for handler in handlers:  # delete the half-written temporary file now
                partial = getattr(handler, "file", None)
                if partial is not None and hasattr(partial, "close"):
                    partial.close()
            raise _too_large(str(exc)) from None


def _too_large(message: str) -> Exception:
    # Imported here: ferry_cloud.api_errors loads DRF's views, whose parser setting imports it back.
    from ferry_cloud.api_errors import RequestTooLarge

    return RequestTooLarge(message)


def upload_limits() -> dict[str, int]:
    from registry.services import MAX_CALIBRATION_BYTES

    return {"file": settings.FERRY_MAX_UPLOAD_BYTES, "calibration": MAX_CALIBRATION_BYTES}
