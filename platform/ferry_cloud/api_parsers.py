"""The REST API's request body parser: JSON, bounded in size.

DRF's JSON parser reads the request stream directly, past Django's DATA_UPLOAD_MAX_MEMORY_SIZE,
so the bound is checked here on the declared length and again on what is read.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.parsers import JSONParser

from ferry_cloud.api_errors import RequestTooLarge


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise RequestTooLarge(
                f"The request body is {declared} bytes; JSON bodies may be {limit} at most."
            )
        return super().parse(stream, media_type, parser_context)
