import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

from gateway.server import build_server


class Command(BaseCommand):
    help = "Run the gRPC gateway that device agents talk to."

    def add_arguments(self, parser):
        parser.add_argument("--address", default=settings.FERRY_GATEWAY_ADDRESS)

    def handle(self, *args, address, **options):
        server, port = build_server(address)
        server.start()
        self.stdout.write(f"gateway listening on {address.rsplit(':', 1)[0]}:{port}", ending="\n")
        self.stdout.flush()
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        server.stop(grace=5).wait()
