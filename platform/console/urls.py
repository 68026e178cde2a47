from django.contrib.auth import views as auth_views
from django.urls import path

from console import views
from console.pages import devices as device_pages
from console.pages import models as model_pages
from console.pages import releases as release_pages
from console.pages import samples as sample_pages

app_name = "console"
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("live/dashboard/", views.dashboard_live, name="dashboard-live"),
    path("redoc/", views.redoc, name="redoc"),
    path("redoc/redoc.standalone.js", views.redoc_bundle, name="redoc-bundle"),
    path("models/", model_pages.models_list, name="models"),
    path("models/<int:model_id>/", model_pages.model_detail, name="model"),
    path("models/<int:model_id>/live/", model_pages.model_live, name="model-live"),
    path("versions/<str:version_id>/", model_pages.version_detail, name="version"),
    path("versions/<str:version_id>/job/", model_pages.version_job, name="version-job"),
    path("versions/<str:version_id>/sample.png", sample_pages.version_sample, name="version-sample"),
    path("groups/", views.groups, name="groups"),
    path("groups/<str:group_id>/pin/", views.group_pin, name="group-pin"),
    path("devices/", device_pages.devices_list, name="devices"),
    path("devices/bulk/", device_pages.devices_bulk, name="devices-bulk"),
    path("devices/<str:device_id>/", device_pages.device_detail, name="device"),
    path("devices/<str:device_id>/live/", device_pages.device_live, name="device-live"),
    path("devices/<str:device_id>/pin/", views.device_pin_view, name="device-pin"),
    path("releases/new/", views.release_new, name="release-new"),
    path("releases/new/preview/", views.release_preview, name="release-preview"),
    path("releases/<str:release_id>/", release_pages.release_detail, name="release"),
    path("releases/<str:release_id>/live/", release_pages.release_live, name="release-live"),
    path("releases/<str:release_id>/canary/", release_pages.release_canary, name="release-canary"),
    path(
        "releases/<str:release_id>/canary/chart/",
        release_pages.release_canary_chart,
        name="release-canary-chart",
    ),
    path("releases/<str:release_id>/gate/", release_pages.release_gate, name="release-gate"),
    path("releases/<str:release_id>/<str:action>/", release_pages.release_action, name="release-action"),
]
