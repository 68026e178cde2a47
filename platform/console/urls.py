from django.contrib.auth import views as auth_views
from django.urls import path

from console import views

app_name = "console"
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("releases/<str:release_id>/<str:action>/", views.release_action, name="release-action"),
]
