"""The gateway's Prometheus metrics (prometheus-client), served on their own HTTP port.

Counters only grow, so rates come from them (rate(ferry_gateway_rpcs_total[5m])); the one
gauge is the number of WatchHints streams open now.  The gateway is one process, so its own
registry is exact: do not give it the web role's PROMETHEUS_MULTIPROC_DIR.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RPCS = Counter("ferry_gateway_rpcs", "gRPC calls handled, by method and status code", ["method", "code"])
RPC_SECONDS = Histogram(
    "ferry_gateway_rpc_duration_seconds",
    "Time from a call's arrival to its last response (a stream's whole life)",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0),
)
HINT_STREAMS = Gauge(
    "ferry_gateway_hint_streams_open", "WatchHints streams open now", multiprocess_mode="livesum"
)
HINT_SECONDS = Histogram(
    "ferry_gateway_hint_delivery_seconds",
    "Time from the hint hub hearing of a change to the stream's hint handed to grpc",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
)
CHECK_INS = Counter(
    "ferry_gateway_check_ins", "Successful check-ins, by whether a package was offered", ["offered"]
)
TELEMETRY_RECORDS = Counter(
    "ferry_gateway_telemetry_records",
    "Telemetry records received, by result (stored, duplicate of one stored before)",
    ["result"],
)
PACKAGE_BYTES = Counter("ferry_gateway_package_bytes_sent", "Package bytes streamed to agents")


def serve(port: int, address: str = "127.0.0.1") -> int:
    """Start the metrics HTTP server on a daemon thread; returns the port it listens on."""
    server, _thread = start_http_server(port, addr=address)
    return server.server_port
