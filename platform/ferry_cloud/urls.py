from accounts.api_tokens import ApiTokenDetailApi, ApiTokenListCreateApi
from django.urls import include, path, re_path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from fleet.api import (
    DeviceBulkApi,
    DeviceDetailApi,
    DeviceListApi,
    DevicePinApi,
    DeviceRevokeApi,
    EnrolmentTokenCreateApi,
    EnrolmentTokenRevokeApi,
    FilterPreviewApi,
    GroupDetailApi,
    GroupListCreateApi,
)
from registry.api import (
    ConversionJobDetailApi,
    ConversionJobListApi,
    ModelDetailApi,
    ModelListCreateApi,
    VersionCreateApi,
    VersionDetailApi,
    VersionListApi,
    VersionPackageApi,
)
from releases.api import (
    AuditFeedApi,
    ReleaseActionApi,
    ReleaseDetailApi,
    ReleaseDevicesApi,
    ReleaseEventsApi,
    ReleaseGateApi,
    ReleaseListCreateApi,
)
from telemetry.api import DeviceTelemetryApi, FleetSummaryApi
from webhooks.api import (
    DeliveryDetailApi,
    DeliveryListApi,
    RedeliverApi,
    WebhookDetailApi,
    WebhookListCreateApi,
    WebhookRotateSecretApi,
)

from ferry_cloud.api_errors import api_not_found
from ferry_cloud.event_stream import EventStreamApi
from ferry_cloud.observability.health import healthz, readyz
from ferry_cloud.observability.metrics import metrics_view


class RowIdConverter:
    """A numeric row id that fits a bigint column; a longer number is an unknown route, not a 500."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(RowIdConverter, "rowid")

api = [
    path("models/", ModelListCreateApi.as_view(), name="models"),
    path("models/<rowid:model_id>/", ModelDetailApi.as_view(), name="model"),
    path("models/<rowid:model_id>/versions/", VersionCreateApi.as_view(), name="model-versions"),
    path("versions/", VersionListApi.as_view(), name="versions"),
    path("versions/<str:version_id>/", VersionDetailApi.as_view(), name="version"),
    path("versions/<str:version_id>/package/", VersionPackageApi.as_view(), name="version-package"),
    path("conversion-jobs/", ConversionJobListApi.as_view(), name="conversion-jobs"),
    path("conversion-jobs/<rowid:job_id>/", ConversionJobDetailApi.as_view(), name="conversion-job"),
    path("enrolment-tokens/", EnrolmentTokenCreateApi.as_view(), name="enrolment-tokens"),
    path("devices/", DeviceListApi.as_view(), name="devices"),
    path("devices/bulk/", DeviceBulkApi.as_view(), name="devices-bulk"),
    path(
        "enrolment-tokens/<rowid:token_id>/revoke/",
        EnrolmentTokenRevokeApi.as_view(),
        name="enrolment-token-revoke",
    ),
    path("devices/<str:device_id>/", DeviceDetailApi.as_view(), name="device"),
    path("devices/<str:device_id>/telemetry/", DeviceTelemetryApi.as_view(), name="device-telemetry"),
    path("devices/<str:device_id>/revoke/", DeviceRevokeApi.as_view(), name="device-revoke"),
    path("devices/<str:device_id>/pin/", DevicePinApi.as_view(), name="device-pin"),
    path("device-groups/", GroupListCreateApi.as_view(), name="device-groups"),
    path("device-filters/preview/", FilterPreviewApi.as_view(), name="device-filter-preview"),
    path("device-groups/<str:group_id>/", GroupDetailApi.as_view(), name="device-group"),
    path("releases/", ReleaseListCreateApi.as_view(), name="releases"),
    path("releases/<str:release_id>/", ReleaseDetailApi.as_view(), name="release"),
    path("releases/<str:release_id>/gate/", ReleaseGateApi.as_view(), name="release-gate"),
    path("releases/<str:release_id>/events/", ReleaseEventsApi.as_view(), name="release-events"),
    path("releases/<str:release_id>/devices/", ReleaseDevicesApi.as_view(), name="release-devices"),
    path("releases/<str:release_id>/<str:action>/", ReleaseActionApi.as_view(), name="release-action"),
    path("api-tokens/", ApiTokenListCreateApi.as_view(), name="api-tokens"),
    path("api-tokens/<rowid:api_token_id>/", ApiTokenDetailApi.as_view(), name="api-token"),
    path("audit/", AuditFeedApi.as_view(), name="audit"),
    path("events/stream/", EventStreamApi.as_view(), name="events-stream"),
    path("webhooks/", WebhookListCreateApi.as_view(), name="webhooks"),
    path("webhooks/<uuid:webhook_id>/", WebhookDetailApi.as_view(), name="webhook"),
    path(
        "webhooks/<uuid:webhook_id>/rotate-secret/",
        WebhookRotateSecretApi.as_view(),
        name="webhook-rotate-secret",
    ),
    path("webhooks/<uuid:webhook_id>/deliveries/", DeliveryListApi.as_view(), name="webhook-deliveries"),
    path(
        "webhooks/<uuid:webhook_id>/deliveries/<uuid:delivery_id>/",
        DeliveryDetailApi.as_view(),
        name="webhook-delivery",
    ),
    path(
        "webhooks/<uuid:webhook_id>/deliveries/<uuid:delivery_id>/redeliver/",
        RedeliverApi.as_view(),
        name="webhook-redeliver",
    ),
    path("fleet/summary/", FleetSummaryApi.as_view(), name="fleet-summary"),
]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", include((api, "api"))),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # the split view serves its start-up script as a file: no inline script, so CSP holds
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    re_path(r"^api/(?P<rest>.*)$", api_not_found, name="api-not-found"),  # JSON 404, no redirect
    path("", include("console.urls")),
]

handler400 = "ferry_cloud.api_errors.handler400"
handler403 = "ferry_cloud.api_errors.handler403"
handler404 = "ferry_cloud.api_errors.handler404"
handler500 = "ferry_cloud.api_errors.handler500"
