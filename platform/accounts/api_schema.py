"""How the OpenAPI document describes Ferry's API tokens (drf-spectacular reads this
extension by the authentication class's dotted path; accounts' AppConfig imports it)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema) -> dict:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token fat_<id>_<secret>`: an API token (POST /api/v1/api-tokens/ or "
            "`manage.py api_token`), shown once at creation.",
        }
