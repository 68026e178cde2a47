import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

from gateway import metrics
from gateway.health import GatewayHealth
from gateway.server import build_server


class Command(BaseCommand):
    help = "Run the gRPC gateway that device agents talk to."

    def add_arguments(self, parser):
        parser.add_argument("--address", default=settings.FERRY_GATEWAY_ADDRESS)
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=settings.FERRY_GATEWAY_METRICS_PORT,
            help="serve Prometheus metrics on this HTTP port (0: none; FERRY_GATEWAY_METRICS_PORT)",
        )
        parser.add_argument(
            "--metrics-address",
            default=settings.FERRY_GATEWAY_METRICS_ADDRESS,
            help="interface for the metrics port (FERRY_GATEWAY_METRICS_ADDRESS, default 127.0.0.1)",
        )

    def handle(self, *args, address, metrics_port, metrics_address, **options):
        health = GatewayHealth()
        server, port = bound = build_server(address, health=health)
        server.start()
        health.start()  # NOT_SERVING until the database answers
        host = address.rsplit(":", 1)[0]
        self.stdout.write(f"gateway listening on {host}:{port} (mutual TLS)", ending="\n")
        self.stdout.write(f"gateway enrolment on port {bound.enrol_port} (TLS)", ending="\n")
        if metrics_port:
            served = metrics.serve(metrics_port, metrics_address)
            self.stdout.write(f"gateway metrics on http://{metrics_address}:{served}/metrics", ending="\n")
        self.stdout.flush()
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        health.stop()  # NOT_SERVING first, so balancers move away during the grace period
        server.stop(grace=5).wait()
