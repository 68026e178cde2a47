"""Conditional requests: an ETag on every resource, If-Match honoured on every change.

A resource's ETag is a hash of its representation (what GET answers), unless the view gives a
cheaper one (a release's revision). A change sent with If-Match goes ahead only while the
resource still has one of the named tags ("*": any), otherwise 412, so a script that read,
decided and wrote cannot overwrite someone else's change unseen.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response

from ferry_cloud.api_errors import PreconditionFailed

IF_MATCH = OpenApiParameter(
    "If-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Change only if the resource still has this ETag (from a GET); 412 otherwise.",
)


def etag_of(representation: Any) -> str:
    text = json.dumps(representation, sort_keys=True, default=str, separators=(",", ":"))
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def tagged(response: Response, tag: str | None = None) -> Response:
    """The response with its ETag (of its own body unless given)."""
    response["ETag"] = tag or etag_of(response.data)
    return response


def require_match(request: Request, current: Any, *, tag: str | None = None) -> None:
    """PreconditionFailed unless If-Match is absent or names the current representation's tag."""
    header = request.headers.get("If-Match")
    if header is None:
        return
    wanted = {t.strip().removeprefix("W/") for t in header.split(",") if t.strip()}
    have = tag or etag_of(current)
    if "*" in wanted or have in wanted:
        return
    raise PreconditionFailed(
        f"The resource changed since you read it (its ETag is now {have}); read it again."
    )


def created(request: Request, data: Any, url_name: str, **kwargs: Any) -> Response:
    """201 with the new resource, its Location and its ETag."""
    response = Response(data, status=201)
    response["Location"] = request.build_absolute_uri(reverse(f"api:{url_name}", kwargs=kwargs))
    return tagged(response)
