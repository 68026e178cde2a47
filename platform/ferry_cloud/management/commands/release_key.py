"""``manage.py release_key rotate``: replace the release key by a rotation signed with the old one."""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.management.base import BaseCommand
from django.db import transaction
from fleet.models import Device
from releases.models import DeviceAssignment

from deploy.trust.rotation import MAX_CHAIN
from ferry_cloud.events import FleetChanged, publish
from ferry_cloud.release_key import rotate_release_key


class Command(BaseCommand):
    help = "Rotate the release key: devices take the new key at their next check-in (signed by the old key)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["rotate"])
        parser.add_argument(
            "--retire-previous",
            action="store_true",
            help="trust only the new key (the old one leaked); earlier versions must be converted again",
        )

    def handle(self, *args, **options) -> None:
        rotation = rotate_release_key(retire_previous=options["retire_previous"])
        # Stored assignments are signed by the old key, which devices stop trusting: mark them due,
        # so each device's next check-in gets a new one (higher counter) under the new key.
        with transaction.atomic():
            organisations = set(DeviceAssignment.objects.values_list("device__organisation_id", flat=True))
            DeviceAssignment.objects.update(expires_at=datetime.now(UTC))
        for organisation_id in organisations:
            publish(FleetChanged(organisation_id=organisation_id))  # drops gateways' cached answers
        self.stdout.write(
            f"rotation {rotation.sequence}: new release key {rotation.keys[0].hex()}; new packages and "
            f"assignments are signed with it; devices of {len(organisations)} organisation(s) take it "
            "at their next check-in"
        )
        self._report_devices_behind(rotation.sequence)

    def _report_devices_behind(self, sequence: int) -> None:
        """Devices catch up through the chain of rotations; one further behind must be enrolled again."""
        live = Device.objects.filter(revoked_at__isnull=True)
        lost = live.filter(release_key_sequence__lt=sequence - MAX_CHAIN).count()
        if lost:
            self.stdout.write(
                f"{lost} device(s) hold a rotation more than {MAX_CHAIN} behind and cannot catch up: "
                "enrol them again (release_key_status reenrol_required in the device list)"
            )
