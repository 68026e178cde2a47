from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"

    def ready(self) -> None:
        from ferry_cloud import events

        from webhooks import fanout, services, tasks

        # Every process that records events (web, worker, gateway) turns them into deliveries;
        # the services reach Celery only through the port registered here.
        events.subscribe(events.AuditEventRecorded, fanout.event_recorded)
        services.delivery_queue_register(send=tasks.send_delivery)
