from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from fleet.api import (
    DeviceListApi,
    DevicePinApi,
    DeviceRevokeApi,
    EnrolmentTokenCreateApi,
    FilterPreviewApi,
    GroupDetailApi,
    GroupListCreateApi,
)
from registry.api import ModelDetailApi, ModelListCreateApi, VersionCreateApi, VersionDetailApi
from releases.api import (
    ReleaseActionApi,
    ReleaseDetailApi,
    ReleaseDevicesApi,
    ReleaseGateApi,
    ReleaseListCreateApi,
)
from telemetry.api import FleetSummaryApi

from ferry_cloud.observability.health import healthz, readyz
from ferry_cloud.observability.metrics import metrics_view

api = [
    path("models/", ModelListCreateApi.as_view(), name="models"),
    path("models/<int:model_id>/", ModelDetailApi.as_view(), name="model"),
    path("models/<int:model_id>/versions/", VersionCreateApi.as_view(), name="model-versions"),
    path("versions/<str:version_id>/", VersionDetailApi.as_view(), name="version"),
    path("enrolment-tokens/", EnrolmentTokenCreateApi.as_view(), name="enrolment-tokens"),
    path("devices/", DeviceListApi.as_view(), name="devices"),
    path("devices/<str:device_id>/revoke/", DeviceRevokeApi.as_view(), name="device-revoke"),
    path("devices/<str:device_id>/pin/", DevicePinApi.as_view(), name="device-pin"),
    path("device-groups/", GroupListCreateApi.as_view(), name="device-groups"),
    path("device-filters/preview/", FilterPreviewApi.as_view(), name="device-filter-preview"),
    path("device-groups/<str:group_id>/", GroupDetailApi.as_view(), name="device-group"),
    path("releases/", ReleaseListCreateApi.as_view(), name="releases"),
    path("releases/<str:release_id>/", ReleaseDetailApi.as_view(), name="release"),
    path("releases/<str:release_id>/gate/", ReleaseGateApi.as_view(), name="release-gate"),
    path("releases/<str:release_id>/devices/", ReleaseDevicesApi.as_view(), name="release-devices"),
    path("releases/<str:release_id>/<str:action>/", ReleaseActionApi.as_view(), name="release-action"),
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
    path("", include("console.urls")),
]
