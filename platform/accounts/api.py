"""Shared by every API view: the organisation the request acts for."""

from __future__ import annotations

from functools import cached_property

from rest_framework.views import APIView

from accounts.models import Organisation
from accounts.selectors import organisation_for_user


class OrganisationApi(APIView):
    @cached_property
    def organisation(self) -> Organisation:
        return organisation_for_user(user=self.request.user)
