import gc
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

from gateway import metrics
from gateway.health import GatewayHealth
from gateway.server import build_server

# 10,000 open streams are a heap of long-lived objects that every full collection walks (0.4 to
# 1.5 s each on a busy host): with Python's thresholds (700, 10, 10) a storm of them made 13,
# and one falling in a release wave stalled every stream's hint that long.  Young collections
# every 50,000 allocations instead make a storm run 2 and a wave (some 20 allocations per
# stream) none; garbage cycles are still collected, a young one costs a few milliseconds.
GC_THRESHOLDS = (50_000, 20, 10)


def _tune_garbage_collection() -> None:
    """Django, the models and grpc (~160,000 objects) collected once and left out of later
    collections (gc.freeze); the thresholds above for what the streams and calls make."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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
        _tune_garbage_collection()
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
