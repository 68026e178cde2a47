"""Writes for organisations and their users."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify

from accounts.models import Membership, Organisation
from accounts.tokens import api_token_create


@transaction.atomic
def organisation_ensure(*, name: str) -> Organisation:
    organisation, _ = Organisation.objects.get_or_create(name=name, defaults={"slug": slugify(name)})
    return organisation


@transaction.atomic
def user_ensure_admin(*, organisation: Organisation, username: str, password: str) -> tuple[object, str]:
    """Create (or reset) an admin of the organisation; return the user and a new API token."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    user.set_password(password)
    user.is_staff = True
    user.save()
    membership, _ = Membership.objects.update_or_create(
        user=user, organisation=organisation, defaults={"role": Membership.Role.ADMIN}
    )
    return user, api_token_create(membership=membership, name=f"{username} (setup)").token
