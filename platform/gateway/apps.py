from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
