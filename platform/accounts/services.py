"""Writes for organisations and their users."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify

from accounts.models import Membership, Organisation

# The API credential is the REST door's (DRF's token table, which its authentication reads):
# accounts.api.api_token_issue, registered by AccountsConfig.ready, makes or finds a user's key.
# A later change gives accounts its own hashed, expiring tokens; this port then goes away.
_token_issuer: dict[str, Callable[[object], str]] = {}


def api_token_issuer_register(*, issue: Callable[[object], str]) -> None:
    _token_issuer["api"] = issue


@transaction.atomic
def organisation_ensure(*, name: str) -> Organisation:
    organisation, _ = Organisation.objects.get_or_create(name=name, defaults={"slug": slugify(name)})
    return organisation


@transaction.atomic
def user_ensure_admin(*, organisation: Organisation, username: str, password: str) -> tuple[object, str]:
    """Create (or reset) an admin of the organisation; return the user and its API token."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    user.set_password(password)
    user.is_staff = True
    user.save()
    Membership.objects.update_or_create(
        user=user, organisation=organisation, defaults={"role": Membership.Role.ADMIN}
    )
    return user, _token_issuer["api"](user)
