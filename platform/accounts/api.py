"""Shared by every API view: the organisation the request acts for, the caller's role (capped by
the request's API token)."""

from __future__ import annotations

from functools import cached_property

from rest_framework.views import APIView

from accounts.models import Membership, Organisation
from accounts.permissions import Undeclared, request_membership


class OrganisationApi(APIView):
    # Each view names the role it needs (accounts/permissions.py); without one it refuses all.
    permission_classes = [Undeclared]

    @cached_property
    def membership(self) -> Membership:
        """The caller's membership, its role capped by the request's API token."""
        return request_membership(self.request)

    @cached_property
    def organisation(self) -> Organisation:
        return self.membership.organisation
