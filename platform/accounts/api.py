"""Shared by every API view: the organisation the request acts for, and API tokens."""

from __future__ import annotations

from functools import cached_property

from rest_framework.authtoken.models import Token
from rest_framework.views import APIView

from accounts.models import Organisation
from accounts.selectors import organisation_for_user


class OrganisationApi(APIView):
    @cached_property
    def organisation(self) -> Organisation:
        return organisation_for_user(user=self.request.user)


def api_token_issue(user) -> str:
    """The user's API token key (DRF's TokenAuthentication reads this table), made on first use."""
    token, _ = Token.objects.get_or_create(user=user)
    return token.key
