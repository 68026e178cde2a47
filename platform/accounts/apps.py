from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"

    def ready(self) -> None:
        from accounts import api_schema  # noqa: F401, PLC0415 - registers the token's OpenAPI scheme
