from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"

    def ready(self) -> None:
        # The Celery door is how conversion jobs reach workers; the services only know the port.
        from registry import services, tasks

        services.conversion_queue_register(send=tasks.send_conversion)
