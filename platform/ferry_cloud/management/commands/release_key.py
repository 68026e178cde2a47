"""``manage.py release_key rotate``: replace the release key by a rotation signed with the old one."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from ferry_cloud.release_key import rotate_release_key


class Command(BaseCommand):
    help = "Rotate the release key: devices take the new key at their next check-in (signed by the old key)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["rotate"])

    def handle(self, *args, **options) -> None:
        rotation = rotate_release_key()
        self.stdout.write(
            f"rotation {rotation.sequence}: new release key {rotation.keys[0].hex()}; "
            "new packages and assignments are signed with it, devices take it at their next check-in"
        )
