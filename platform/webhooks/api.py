"""REST doors onto webhooks: subscriptions (admin only: they send the organisation's events to
a URL of the admin's choosing), their delivery log, redelivery and secret rotation."""

from __future__ import annotations

from accounts.api import OrganisationApi
from accounts.models import Membership
from accounts.permissions import RolePermission
from drf_spectacular.utils import extend_schema
from ferry_cloud.api_conditions import IF_MATCH, created, require_match, tagged
from ferry_cloud.api_lists import ListQuery, list_query, page_of, paginated
from ferry_cloud.api_shapes import StrictSerializer
from ferry_cloud.events import EVENT_TYPES
from ferry_cloud.idempotency import HEADER as IDEMPOTENCY_KEY
from ferry_cloud.idempotency import idempotent
from rest_framework import serializers, status
from rest_framework.response import Response

from webhooks import selectors, services
from webhooks.models import Webhook, WebhookDelivery


class AdminOnly(RolePermission):
    """Reads too: a webhook's URL may itself hold a credential of the receiver's."""

    read_role = Membership.Role.ADMIN
    write_role = Membership.Role.ADMIN


EventTypes = serializers.ListField(
    child=serializers.ChoiceField(choices=sorted(EVENT_TYPES)),
    max_length=len(EVENT_TYPES),
    required=False,
    help_text="The event types to send; empty or absent: every type.",
)


class WebhookInput(StrictSerializer):
    url = serializers.URLField(max_length=2000, help_text="Where events are POSTed (https:// advised).")
    event_types = EventTypes
    description = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)

    def validate_url(self, value: str) -> str:
        if not value.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("Must be an http:// or https:// URL.")
        return value


class WebhookUpdateInput(WebhookInput):
    url = serializers.URLField(max_length=2000, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    active = serializers.BooleanField(required=False, help_text="false: send nothing until true again.")


class WebhookOutput(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True)
    event_types = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = Webhook
        fields = [
            "id",
            "url",
            "event_types",
            "description",
            "active",
            "created_by",
            "created_at",
            "updated_at",
        ]


class WebhookSecretOutput(WebhookOutput):
    secret = serializers.CharField(
        help_text="Signs every delivery (Ferry-Signature); shown in this answer only."
    )

    class Meta(WebhookOutput.Meta):
        fields = [*WebhookOutput.Meta.fields, "secret"]


class AttemptOutput(serializers.Serializer):
    attempt = serializers.IntegerField()
    at = serializers.DateTimeField()
    status_code = serializers.IntegerField(allow_null=True, help_text="null: no HTTP answer (see error).")
    error = serializers.CharField(allow_blank=True)
    duration_ms = serializers.FloatField()
    response = serializers.CharField(allow_blank=True, help_text="The start of the receiver's answer.")


class DeliveryOutput(serializers.ModelSerializer):
    webhook = serializers.UUIDField(source="webhook_id")
    redelivery_of = serializers.UUIDField(source="redelivery_of_id", allow_null=True)
    log = AttemptOutput(many=True, help_text="Every attempt, oldest first (the last 25).")
    payload = serializers.JSONField(help_text="The body sent: the event feed's row.")

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "webhook",
            "event_id",
            "event_type",
            "state",
            "attempts",
            "next_attempt_at",
            "last_status_code",
            "last_error",
            "created_at",
            "delivered_at",
            "redelivery_of",
            "log",
            "payload",
        ]


class WebhookQuery(ListQuery):
    ORDERING = ("-created_at", "created_at")


class DeliveryQuery(ListQuery):
    ORDERING = ("-created_at", "created_at")

    state = serializers.ChoiceField(choices=WebhookDelivery.State.choices, required=False)


class WebhookListCreateApi(OrganisationApi):
    permission_classes = [AdminOnly]

    @extend_schema(
        parameters=[WebhookQuery],
        responses=page_of(WebhookOutput, "WebhookPage"),
        operation_id="v1_webhooks_list",
    )
    def get(self, request):
        query = list_query(WebhookQuery, request)
        rows = selectors.webhook_list(organisation=self.organisation).select_related("created_by")
        return paginated(request, rows, query, lambda page: WebhookOutput(page, many=True).data)

    @extend_schema(request=WebhookInput, responses={201: WebhookSecretOutput}, parameters=[IDEMPOTENCY_KEY])
    @idempotent(secret=("secret",))
    def post(self, request):
        """Subscribe a URL to the organisation's events; the signing secret is in this answer only."""
        data = WebhookInput(data=request.data)
        data.is_valid(raise_exception=True)
        webhook = services.webhook_create(
            organisation=self.organisation,
            url=data.validated_data["url"],
            event_types=list(data.validated_data.get("event_types", [])),
            description=data.validated_data["description"],
            actor=request.user,
        )
        return created(request, WebhookSecretOutput(webhook).data, "webhook", webhook_id=webhook.pk)


class WebhookDetailApi(OrganisationApi):
    permission_classes = [AdminOnly]

    def _webhook(self, webhook_id) -> Webhook:
        return selectors.webhook_get(organisation=self.organisation, webhook_id=webhook_id)

    @extend_schema(responses=WebhookOutput)
    def get(self, request, webhook_id):
        return tagged(Response(WebhookOutput(self._webhook(webhook_id)).data))

    @extend_schema(request=WebhookUpdateInput, responses=WebhookOutput, parameters=[IF_MATCH])
    def patch(self, request, webhook_id):
        """Change the URL, event types, description, or switch it off and on."""
        webhook = self._webhook(webhook_id)
        require_match(request, WebhookOutput(webhook).data)
        data = WebhookUpdateInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        changes = {k: list(v) if k == "event_types" else v for k, v in data.validated_data.items()}
        webhook = services.webhook_update(webhook=webhook, **changes)
        return tagged(Response(WebhookOutput(webhook).data))

    @extend_schema(request=None, responses={204: None}, parameters=[IF_MATCH])
    def delete(self, request, webhook_id):
        """Unsubscribe: nothing more is sent, pending deliveries included; the log goes too."""
        webhook = self._webhook(webhook_id)
        require_match(request, WebhookOutput(webhook).data)
        services.webhook_delete(webhook=webhook)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateSecretApi(OrganisationApi):
    permission_classes = [AdminOnly]

    @extend_schema(request=None, responses=WebhookSecretOutput)
    def post(self, request, webhook_id):
        """A new signing secret, shown in this answer only; the old one stops signing at once."""
        webhook = selectors.webhook_get(organisation=self.organisation, webhook_id=webhook_id)
        return Response(WebhookSecretOutput(services.webhook_rotate_secret(webhook=webhook)).data)


class DeliveryListApi(OrganisationApi):
    permission_classes = [AdminOnly]

    @extend_schema(
        parameters=[DeliveryQuery],
        responses=page_of(DeliveryOutput, "WebhookDeliveryPage"),
        operation_id="v1_webhooks_deliveries_list",
    )
    def get(self, request, webhook_id):
        """The webhook's delivery log, newest first: each event sent, its attempts and answers."""
        query = list_query(DeliveryQuery, request)
        webhook = selectors.webhook_get(organisation=self.organisation, webhook_id=webhook_id)
        rows = selectors.delivery_list(webhook=webhook, state=query.get("state"))
        return paginated(request, rows, query, lambda page: DeliveryOutput(page, many=True).data)


class DeliveryDetailApi(OrganisationApi):
    permission_classes = [AdminOnly]

    @extend_schema(responses=DeliveryOutput)
    def get(self, request, webhook_id, delivery_id):
        webhook = selectors.webhook_get(organisation=self.organisation, webhook_id=webhook_id)
        return Response(DeliveryOutput(selectors.delivery_get(webhook=webhook, delivery_id=delivery_id)).data)


class RedeliverApi(OrganisationApi):
    permission_classes = [AdminOnly]

    @extend_schema(request=None, responses={201: DeliveryOutput})
    def post(self, request, webhook_id, delivery_id):
        """Send the delivery's event again, as a new delivery (a receiver dedupes by event id)."""
        webhook = selectors.webhook_get(organisation=self.organisation, webhook_id=webhook_id)
        delivery = selectors.delivery_get(webhook=webhook, delivery_id=delivery_id)
        again = services.delivery_redeliver(delivery=delivery)
        body = DeliveryOutput(again).data
        return created(request, body, "webhook-delivery", webhook_id=webhook.pk, delivery_id=again.pk)
