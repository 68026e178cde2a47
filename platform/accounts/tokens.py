"""API tokens: issue (shown once), authenticate, list and revoke.

A token reads ``fat_<id>_<secret>``: the id finds the row, the secret (256 random bits) is kept
only as its sha256. A fast hash is enough here: a slow hash (bcrypt, argon2) protects
low-entropy passwords from guessing, and nobody can guess 256 random bits, fast hash or not;
a slow hash would only make every API request slower.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from ferry_cloud.errors import Invalid, NotFound, PermissionDenied, Unauthenticated

from accounts.models import ROLE_RANK, ApiToken, Membership
from accounts.selectors import ROLE_NAMES

PREFIX = "fat_"
_SHAPE = re.compile(r"^fat_([0-9]{1,18})_([A-Za-z0-9_-]{43})$")


class ApiTokenRefused(Unauthenticated):
    code = "invalid_token"


class ApiTokenRoleTooHigh(PermissionDenied):
    """A token may not carry a role above its creator's (nor above the token that asks)."""


class InvalidTokenLifetime(Invalid):
    code = "invalid_token_lifetime"


class ApiTokenNotFound(NotFound):
    code = "api_token_not_found"


@dataclass(frozen=True)
class IssuedApiToken:
    token: str  # shown once; only its hash is stored
    record: ApiToken


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def role_capped(role: str, cap: str | None) -> str:
    """The lower of two roles (cap None: role unchanged)."""
    if cap is None:
        return role
    return role if ROLE_RANK.get(role, -1) <= ROLE_RANK.get(cap, -1) else cap


@transaction.atomic
def api_token_create(
    *,
    membership: Membership,
    role: str | None = None,
    name: str = "",
    days: int | None = None,
    cap: str | None = None,
) -> IssuedApiToken:
    """A new token for the member, with ``role`` (default: theirs) at most their role and ``cap``.

    ``cap`` is the role of the token the request came with: a token cannot mint a stronger one.
    """
    ceiling = role_capped(membership.role, cap)
    role = role or ceiling
    if role not in ROLE_RANK:
        raise Invalid(f"Unknown role {role!r}: one of {', '.join(ROLE_NAMES.values())}.")
    if ROLE_RANK[role] > ROLE_RANK.get(ceiling, -1):
        raise ApiTokenRoleTooHigh(
            f"A token can carry at most your role ({ROLE_NAMES.get(ceiling, ceiling)}); "
            f"you asked for {ROLE_NAMES[role]}."
        )
    days = settings.FERRY_API_TOKEN_DAYS if days is None else days
    if not 1 <= days <= settings.FERRY_API_TOKEN_MAX_DAYS:
        raise InvalidTokenLifetime(
            f"A token lives 1 to {settings.FERRY_API_TOKEN_MAX_DAYS} days; you asked for {days}."
        )
    secret = secrets.token_urlsafe(32)  # 256 bits, 43 characters
    record = ApiToken.objects.create(
        user=membership.user,
        organisation=membership.organisation,
        name=name,
        role=role,
        secret_sha256=_sha256(secret),
        expires_at=timezone.now() + timedelta(days=days),
    )
    return IssuedApiToken(token=f"{PREFIX}{record.pk}_{secret}", record=record)


def api_token_authenticate(raw: str) -> ApiToken:
    """The live token ``raw`` names, or ApiTokenRefused saying why (never which part was wrong)."""
    match = _SHAPE.match(raw or "")
    record = None
    if match:
        record = ApiToken.objects.select_related("user").filter(pk=int(match.group(1))).first()
    # Compare even without a row, so timing does not tell an unknown id from a wrong secret.
    expected = record.secret_sha256 if record else "0" * 64
    given = _sha256(match.group(2)) if match else ""
    if record is None or not hmac.compare_digest(expected, given):
        raise ApiTokenRefused("Invalid API token.")
    now = timezone.now()
    if record.revoked_at is not None:
        raise ApiTokenRefused("This API token has been revoked; create a new one.")
    if record.expires_at <= now:
        raise ApiTokenRefused("This API token has expired; create a new one.")
    if not record.user.is_active:
        raise ApiTokenRefused("This API token's user is inactive.")
    if record.last_used_at is None or now - record.last_used_at > timedelta(minutes=5):
        # at most one write per token every few minutes, not one per request
        ApiToken.objects.filter(pk=record.pk).update(last_used_at=now)
    return record


def api_token_list(*, membership: Membership):
    """The organisation's tokens for an admin, the member's own otherwise; newest first."""
    tokens = ApiToken.objects.filter(organisation=membership.organisation).select_related("user")
    if not membership.has_role(Membership.Role.ADMIN):
        tokens = tokens.filter(user=membership.user)
    return tokens.order_by("-created_at", "-id")


def api_token_get(*, membership: Membership, token_id: int) -> ApiToken:
    """One token the member may see (api_token_list), else ApiTokenNotFound."""
    record = api_token_list(membership=membership).filter(pk=token_id).first()
    if record is None:
        raise ApiTokenNotFound(f"No API token {token_id} of yours in {membership.organisation.name}.")
    return record


def api_token_revoke(*, record: ApiToken) -> ApiToken:
    """Stop the token now; revoking a revoked token changes nothing."""
    if record.revoked_at is None:
        record.revoked_at = timezone.now()
        record.save(update_fields=["revoked_at"])
    return record
