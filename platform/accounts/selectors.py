"""Reads: which organisation a request acts for."""

from __future__ import annotations

from ferry_cloud.errors import PermissionDenied

from accounts.models import Organisation


class NoOrganisation(PermissionDenied):
    code = "no_organisation"


def organisation_for_user(*, user) -> Organisation:
    """The user's organisation (one per user for now; the first membership wins)."""
    membership = user.memberships.select_related("organisation").order_by("id").first() if user else None
    if membership is None:
        raise NoOrganisation("This account belongs to no organisation; ask an admin to add you to one.")
    return membership.organisation
