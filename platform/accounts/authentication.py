"""The REST door's credential check: ``Authorization: Token fat_<id>_<secret>`` (accounts/tokens.py)."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from accounts.models import ApiToken
from accounts.tokens import ApiTokenRefused, api_token_authenticate

KEYWORDS = (b"token", b"bearer")


class ApiTokenAuthentication(BaseAuthentication):
    """Checks the hash (constant time), expiry and revocation; request.auth is the ApiToken,
    whose role then caps the user's (accounts.permissions.request_membership)."""

    keyword = "Token"

    def authenticate(self, request) -> tuple[object, ApiToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in KEYWORDS:
            return None  # another scheme (or none): the session may still authenticate
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header: expected 'Token <token>'.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid API token.") from None
        try:
            record = api_token_authenticate(raw)
        except ApiTokenRefused as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return record.user, record

    def authenticate_header(self, request) -> str:
        return self.keyword
