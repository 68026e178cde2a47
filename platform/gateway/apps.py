from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save
        from ferry_cloud import events
        from releases.models import Release

        from gateway.hints import fleet_changed, hint_fleet_changed
        from gateway.revocations import device_revoked

        # Services announce fleet changes as domain events; in every process that writes (web,
        # worker, shell) the gateway turns them into WatchHints for agents on any replica.
        events.subscribe(events.FleetChanged, hint_fleet_changed)
        # ... and revocations into "forget this device" for gateways answering from memory (its
        # import also connects desired_cache's signals, which bump the fleet generation)
        events.subscribe(events.DeviceRevoked, device_revoked)

        # Every saved or deleted Release row hints too, the admin's and a shell's included.
        def announce(sender, instance: Release, **kwargs) -> None:
            fleet_changed(organisation_id=instance.organisation_id)

        post_save.connect(announce, sender=Release, dispatch_uid="gateway-hint-on-release-save", weak=False)
        post_delete.connect(
            announce, sender=Release, dispatch_uid="gateway-hint-on-release-delete", weak=False
        )
