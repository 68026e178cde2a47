"""Who may call which REST endpoint: one permission class per required role.

Every API view declares exactly one of these in ``permission_classes``; reads (GET, HEAD,
OPTIONS) need a viewer, and the class names the role its writes need. OrganisationApi's
default, Undeclared, refuses everyone, so a view that forgets to declare fails closed (and
tests/platform/test_roles.py fails). Roles rank viewer < operator (stored as release_manager)
< admin (accounts.models.ROLE_RANK).

Order of answers: no credential 401, no organisation or a role too low 403
({"error": {"code": "permission_denied"}}), a method the view lacks 405; a row of another
organisation is then 404 from the view's scoped selector.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from accounts.models import ApiToken, Membership
from accounts.selectors import RoleTooLow, membership_for_user, role_require
from accounts.tokens import role_capped

Role = Membership.Role


class RolePermission(BasePermission):
    """Reads need ``read_role``, every other method ``write_role``; None refuses the method."""

    read_role: str | None = Role.VIEWER
    write_role: str | None = None

    @classmethod
    def required_role(cls, method: str) -> str | None:
        return cls.read_role if method.upper() in SAFE_METHODS else cls.write_role

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False  # DRF answers 401, naming the Token scheme
        if not hasattr(view, request.method.lower()):
            return True  # nothing to guard: DRF answers 405
        required = self.required_role(request.method)
        if required is None:
            raise RoleTooLow(f"No role may {request.method} here: the endpoint declares none.")
        role_require(membership=_membership(request, view), role=required)
        return True


class ReadOnly(RolePermission):
    """Any member reads; the view takes no writes (adding one without a role refuses it)."""


class ViewerQueries(RolePermission):
    """A POST that changes nothing (a filter preview): any member."""

    write_role = Role.VIEWER


class MemberWrites(RolePermission):
    """Writes any member makes on their own things (API tokens); the view scopes the rows."""

    write_role = Role.VIEWER


class OperatorWrites(RolePermission):
    """Writes need an operator: uploads, conversions, releases and their actions, pins, groups."""

    write_role = Role.RELEASE_MANAGER


class AdminWrites(RolePermission):
    """Writes need an admin: enrolment tokens, device revocation (later members, keys)."""

    write_role = Role.ADMIN


class Undeclared(RolePermission):
    """OrganisationApi's default: a view that names no role refuses every method."""

    read_role = None


def _membership(request, view) -> Membership:
    # OrganisationApi caches it, so the role check and the view's organisation share one query.
    cached = getattr(view, "membership", None)
    return cached if isinstance(cached, Membership) else request_membership(request)


def request_membership(request) -> Membership:
    """The caller's membership, its role capped by the API token the request came with.

    The capped role lives on this in-memory copy only (never saved): the token lowers what
    this request may do, not what the member may do.
    """
    membership = membership_for_user(user=request.user)
    token = getattr(request, "auth", None)
    if isinstance(token, ApiToken):
        if token.organisation_id != membership.organisation_id:
            membership = membership_for_user(user=request.user, organisation_id=token.organisation_id)
        membership.role = role_capped(membership.role, token.role)
    return membership


def declared_permission(view_class: type) -> type[RolePermission] | None:
    """The one RolePermission a view class declares (None if none or several, or Undeclared)."""
    declared = [
        p
        for p in getattr(view_class, "permission_classes", ())
        if isinstance(p, type) and issubclass(p, RolePermission)
    ]
    if len(declared) != 1 or declared[0] is Undeclared:
        return None
    return declared[0]
