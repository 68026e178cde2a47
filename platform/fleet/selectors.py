"""Reads for the fleet."""

from __future__ import annotations

from accounts.models import Organisation
from django.db.models import Count, QuerySet

from fleet.models import Device


def device_list(*, organisation: Organisation) -> QuerySet[Device]:
    return Device.objects.filter(organisation=organisation).select_related("running_version__model")


def devices_per_version(*, organisation: Organisation) -> list[dict]:
    """[{"version": "model:label" or None, "devices": n}], the fleet's current spread."""
    rows = (
        Device.objects.filter(organisation=organisation, revoked_at__isnull=True)
        .values("running_version__model__name", "running_version__label")
        .annotate(devices=Count("id"))
        .order_by("running_version__model__name", "running_version__label")
    )
    return [
        {
            "version": (
                f"{r['running_version__model__name']}:{r['running_version__label']}"
                if r["running_version__label"]
                else None
            ),
            "devices": r["devices"],
        }
        for r in rows
    ]
