"""Shared by every API view: the organisation the request acts for, the caller's role, API tokens."""

from __future__ import annotations

from functools import cached_property

from rest_framework.authtoken.models import Token
from rest_framework.views import APIView

from accounts.models import Membership, Organisation
from accounts.permissions import Undeclared
from accounts.selectors import membership_for_user


class OrganisationApi(APIView):
    # Each view names the role it needs (accounts/permissions.py); without one it refuses all.
    permission_classes = [Undeclared]

    @cached_property
    def membership(self) -> Membership:
        return membership_for_user(user=self.request.user)

    @cached_property
    def organisation(self) -> Organisation:
        return self.membership.organisation


def api_token_issue(user) -> str:
    """The user's API token key (DRF's TokenAuthentication reads this table), made on first use.

    No endpoint issues tokens yet (``manage.py drf_create_token`` and the demo do); one that
    does must declare AdminWrites, like enrolment tokens.
    """
    token, _ = Token.objects.get_or_create(user=user)
    return token.key
