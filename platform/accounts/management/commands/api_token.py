"""manage.py api_token: create, list or revoke a user's API tokens (the secret is printed once)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from ferry_cloud.errors import DomainError

from accounts import tokens
from accounts.selectors import ROLE_NAMES, membership_for_user

_ROLE_BY_NAME = {name: stored for stored, name in ROLE_NAMES.items()}


class Command(BaseCommand):
    help = "Create an API token for a user (printed once), or --list / --revoke ID their tokens."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", choices=sorted(_ROLE_BY_NAME), help="at most the user's role")
        parser.add_argument("--days", type=int, help="lifetime (default FERRY_API_TOKEN_DAYS)")
        parser.add_argument("--name", default="", help="what the token is for")
        parser.add_argument("--list", action="store_true", help="list the user's tokens, no secrets")
        parser.add_argument("--revoke", type=int, metavar="ID", help="revoke the user's token ID")

    def handle(self, *args, **options) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user {options['username']!r}.")
        try:
            membership = membership_for_user(user=user)
            if options["list"]:
                for t in tokens.api_token_list(membership=membership).filter(user=user):
                    state = "revoked" if t.revoked_at else f"expires {t.expires_at:%Y-%m-%d %H:%M}Z"
                    self.stdout.write(f"{t.pk}\t{ROLE_NAMES.get(t.role, t.role)}\t{state}\t{t.name}")
                return
            if options["revoke"] is not None:
                record = tokens.api_token_get(membership=membership, token_id=options["revoke"])
                tokens.api_token_revoke(record=record)
                self.stdout.write(f"Revoked API token {record.pk}.")
                return
            issued = tokens.api_token_create(
                membership=membership,
                role=_ROLE_BY_NAME[options["role"]] if options["role"] else None,
                name=options["name"],
                days=options["days"],
            )
        except DomainError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(issued.token)
