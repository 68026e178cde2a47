"""REST doors onto API tokens (accounts/tokens.py).

Who manages which token: any member lists, creates and revokes their own tokens (a token's role
is at most theirs, and at most that of the token the request came with); an admin also lists
and revokes every token of the organisation. Another organisation's token is 404.
"""

from __future__ import annotations

# First: DRF's APIView must load before ferry_cloud.api_errors, which DRF's parser setting imports.
from accounts.api import OrganisationApi

# isort: split

from drf_spectacular.utils import extend_schema
from ferry_cloud.api_conditions import created
from ferry_cloud.api_lists import ListQuery, list_query, page_of, paginated
from ferry_cloud.api_shapes import StrictSerializer
from ferry_cloud.idempotency import HEADER as IDEMPOTENCY_KEY
from ferry_cloud.idempotency import idempotent
from rest_framework import serializers
from rest_framework.response import Response

from accounts import tokens
from accounts.models import ApiToken
from accounts.permissions import MemberWrites
from accounts.selectors import ROLE_NAMES

# On the wire a role has its documented name; the stored release_manager is the operator.
_ROLE_BY_NAME = {name: stored for stored, name in ROLE_NAMES.items()}


class ApiTokenInput(StrictSerializer):
    name = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    role = serializers.ChoiceField(
        choices=sorted(_ROLE_BY_NAME), required=False, help_text="At most your own role; default yours."
    )
    days = serializers.IntegerField(
        min_value=1, max_value=3650, required=False, help_text="Lifetime; default FERRY_API_TOKEN_DAYS (90)."
    )


class ApiTokenRecordOutput(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    role = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "user", "role", "created_at", "expires_at", "revoked_at", "last_used_at"]

    def get_role(self, obj: ApiToken) -> str:
        return ROLE_NAMES.get(obj.role, obj.role)


class ApiTokenOutput(ApiTokenRecordOutput):
    token = serializers.SerializerMethodField(help_text="Shown once: only its hash is kept.")

    class Meta(ApiTokenRecordOutput.Meta):
        fields = [*ApiTokenRecordOutput.Meta.fields, "token"]

    def get_token(self, obj: ApiToken) -> str:
        return self.context["token"]


class ApiTokenQuery(ListQuery):
    ORDERING = ("-created_at", "created_at")


class ApiTokenListCreateApi(OrganisationApi):
    permission_classes = [MemberWrites]

    @extend_schema(
        parameters=[ApiTokenQuery],
        responses=page_of(ApiTokenRecordOutput, "ApiTokenPage"),
        operation_id="v1_api_tokens_list",
    )
    def get(self, request):
        """Your API tokens (an admin: the organisation's), never the secrets."""
        query = list_query(ApiTokenQuery, request)
        rows = tokens.api_token_list(membership=self.membership)
        return paginated(request, rows, query, lambda page: ApiTokenRecordOutput(page, many=True).data)

    @extend_schema(request=ApiTokenInput, responses={201: ApiTokenOutput}, parameters=[IDEMPOTENCY_KEY])
    @idempotent(secret=("token",))
    def post(self, request):
        """A new API token for you; its secret is in this answer only."""
        data = ApiTokenInput(data=request.data)
        data.is_valid(raise_exception=True)
        wanted = data.validated_data.get("role")
        token = request.auth if isinstance(request.auth, ApiToken) else None
        issued = tokens.api_token_create(
            membership=self.membership,
            role=_ROLE_BY_NAME[wanted] if wanted else None,
            name=data.validated_data["name"],
            days=data.validated_data.get("days"),
            cap=token.role if token else None,
        )
        body = ApiTokenOutput(issued.record, context={"token": issued.token}).data
        return created(request, body, "api-token", api_token_id=issued.record.pk)


class ApiTokenDetailApi(OrganisationApi):
    permission_classes = [MemberWrites]

    @extend_schema(responses=ApiTokenRecordOutput)
    def get(self, request, api_token_id: int):
        record = tokens.api_token_get(membership=self.membership, token_id=api_token_id)
        return Response(ApiTokenRecordOutput(record).data)

    @extend_schema(request=None, responses=ApiTokenRecordOutput)
    def delete(self, request, api_token_id: int):
        """Revoke the token now (yours; an admin: any of the organisation's). Idempotent."""
        record = tokens.api_token_get(membership=self.membership, token_id=api_token_id)
        return Response(ApiTokenRecordOutput(tokens.api_token_revoke(record=record)).data)
