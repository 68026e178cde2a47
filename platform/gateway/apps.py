from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self) -> None:
        # Bridge release writes to WatchHints: whichever process saves a release (web, worker,
        # shell) announces it, so agents connected to any gateway replica check in at once.
        from django.db.models.signals import post_delete, post_save
        from releases.models import Release

        from gateway.hints import fleet_changed

        def announce(sender, instance: Release, **kwargs) -> None:
            fleet_changed(organisation_id=instance.organisation_id)

        post_save.connect(announce, sender=Release, dispatch_uid="gateway-hint-on-release-save", weak=False)
        post_delete.connect(
            announce, sender=Release, dispatch_uid="gateway-hint-on-release-delete", weak=False
        )
