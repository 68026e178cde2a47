from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"

    def ready(self) -> None:
        # API tokens are the REST door's credential; the services ask the door for one.
        from accounts import api, services

        services.api_token_issuer_register(issue=api.api_token_issue)
