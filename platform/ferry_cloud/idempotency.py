"""Idempotency-Key on creates: a retry with the same key and body gets the first answer again.

Like Stripe's: the key is the caller's (scoped to the user), kept at least KEEP (24 h); the same
key with another body, path or method is a 409, and so is a retry while the first request still
runs. A request that failed with an error created nothing, so its key is not held: the retry runs
again. The record is committed before the create runs, so two concurrent retries cannot both
create (the unique constraint lets one through).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response

from ferry_cloud.errors import Conflict, Invalid
from ferry_cloud.models import IdempotencyRecord

KEEP = timedelta(hours=24)
PURGE_AFTER = 2 * KEEP  # rows are deleted some time after they may be replayed
ABANDONED_AFTER = timedelta(minutes=10)  # a first request that never finished (its process died)
KEY = re.compile(r"^[\x21-\x7e]{1,255}$")

HEADER = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Retry-safe create: the same key and body within 24 h answers the first response again.",
)


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class IdempotencyKeyInFlight(Conflict):
    code = "idempotency_key_in_flight"


class IdempotentSecretShown(Conflict):
    code = "idempotent_secret_shown"


class InvalidIdempotencyKey(Invalid):
    code = "invalid_idempotency_key"


def _fingerprint(request: Request) -> str:
    digest = hashlib.sha256(f"{request.method} {request.path}\n".encode())
    if request.content_type.startswith("multipart/"):
        for name in sorted(set(request.data) - set(request.FILES)):
            digest.update(f"{name}={request.data.getlist(name)!r}\n".encode())
        for name in sorted(request.FILES):
            for upload in request.FILES.getlist(name):
                digest.update(f"{name}:{upload.size}\n".encode())
                for chunk in upload.chunks():
                    digest.update(chunk)
                upload.seek(0)
    else:
        digest.update(request.body)
    return digest.hexdigest()


def _begin(
    request: Request, key: str, fingerprint: str, secret: tuple[str, ...]
) -> tuple[IdempotencyRecord | None, Response | None]:
    """The new record to complete, or the answer to replay (a Conflict if neither may go)."""
    now = timezone.now()
    IdempotencyRecord.objects.filter(user=request.user, created_at__lt=now - PURGE_AFTER).delete()
    try:
        with transaction.atomic():
            return IdempotencyRecord.objects.create(user=request.user, key=key, fingerprint=fingerprint), None
    except IntegrityError:
        pass
    record = IdempotencyRecord.objects.get(user=request.user, key=key)
    if record.fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            "This Idempotency-Key was used for another request (a different body, path or method); "
            "use a new key for a new request."
        )
    if record.status_code is not None and secret:
        raise IdempotentSecretShown(
            f"The first request with this Idempotency-Key created {record.body}; "
            f"its {', '.join(secret)} was shown once and is not kept. "
            "Revoke that one if it is lost, and create another with a new key."
        )
    if record.status_code is not None:
        response = Response(record.body, status=record.status_code, headers={"Idempotent-Replayed": "true"})
        if record.location:
            response["Location"] = record.location
        return None, response
    if record.created_at > now - ABANDONED_AFTER:
        raise IdempotencyKeyInFlight(
            "A request with this Idempotency-Key is still running; retry in a moment."
        )
    record.created_at = now  # its first request died: this one takes the key over
    record.save(update_fields=["created_at"])
    return record, None


def idempotent(handler: Callable[..., Response] | None = None, *, secret: tuple[str, ...] = ()):
    """Wrap a view's create (post) method: honour an Idempotency-Key header if one is sent.

    ``secret`` names the response fields shown once and never stored (an enrolment token): a
    replay cannot repeat it, so it answers 409 naming what the first request created.
    """
    if handler is None:
        return functools.partial(idempotent, secret=secret)

    @functools.wraps(handler)
    def wrapper(view, request: Request, *args, **kwargs) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return handler(view, request, *args, **kwargs)
        if not KEY.match(key):
            raise InvalidIdempotencyKey(
                "Idempotency-Key must be 1 to 255 printable ASCII characters, no spaces."
            )
        record, replay = _begin(request, key, _fingerprint(request), secret)
        if replay is not None:
            return replay
        try:
            response = handler(view, request, *args, **kwargs)
        except BaseException:
            record.delete()  # nothing was created: the retry runs again
            raise
        if response.status_code >= 400:
            record.delete()
        else:
            body = dict(response.data)
            for name in secret:
                body.pop(name, None)
            record.status_code, record.body = response.status_code, body
            record.location = response.get("Location", "")
            record.save(update_fields=["status_code", "body", "location"])
        return response

    return wrapper
