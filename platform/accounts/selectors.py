"""Reads: which organisation a request acts for, and whether the caller's role allows an action."""

from __future__ import annotations

from ferry_cloud.errors import PermissionDenied

from accounts.models import Membership, Organisation

# How people read the roles in refusals: the stored release_manager is the operator.
ROLE_NAMES: dict[str, str] = {
    Membership.Role.VIEWER: "viewer",
    Membership.Role.RELEASE_MANAGER: "operator",
    Membership.Role.ADMIN: "admin",
}


class NoOrganisation(PermissionDenied):
    code = "no_organisation"


class RoleTooLow(PermissionDenied):
    """The caller belongs to the organisation, but its role is below what the action needs.

    It keeps the family's code, permission_denied: callers tell it from no_organisation.
    """


def membership_for_user(*, user, organisation_id: int | None = None) -> Membership:
    """The user's membership (one organisation per user for now; the first membership wins),
    or their membership of ``organisation_id`` (an API token's organisation)."""
    membership = None
    if user is not None and user.is_authenticated:
        memberships = user.memberships.select_related("organisation").order_by("id")
        if organisation_id is not None:
            memberships = memberships.filter(organisation_id=organisation_id)
        membership = memberships.first()
    if membership is None:
        raise NoOrganisation("This account belongs to no organisation; ask an admin to add you to one.")
    return membership


def organisation_for_user(*, user) -> Organisation:
    """The user's organisation (see membership_for_user)."""
    return membership_for_user(user=user).organisation


def role_require(*, membership: Membership, role: str) -> None:
    """Refuse (RoleTooLow) unless the member's role is ``role`` or above."""
    if not membership.has_role(role):
        raise RoleTooLow(
            f"This needs the {ROLE_NAMES[role]} role or above; you are "
            f"{_with_article(ROLE_NAMES.get(membership.role, membership.role))} in "
            f"{membership.organisation.name}. Ask an admin of the organisation."
        )


def _with_article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"
