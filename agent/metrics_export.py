"""The agent's own metrics for a local Prometheus scrape, opt-in and without any dependency.

`ferry-agent run --metrics-textfile /var/lib/node_exporter/textfile/ferry_agent.prom` writes
node-exporter's textfile format after every metrics interval (atomically: a temporary file
renamed over the old one, so a scrape never reads half a file); `--metrics-port N` serves the
same text on http://127.0.0.1:N/metrics.  Either or both; nothing is exposed otherwise.

Counters are totals since the agent started (a restart resets them, which Prometheus's rate()
handles); the figures come from the same reading the agent reports as telemetry.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    return repr(float(value)) if value is not None else "NaN"


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[tuple[dict[str, str], Any]] = []

    def add(self, value: Any, **labels: str) -> _Family:
        self.samples.append((labels, value))
        return self

    def render(self) -> str:
        sample_name = f"{self.name}_total" if self.kind == "counter" else self.name
        lines = [f"# HELP {sample_name} {self.help}", f"# TYPE {sample_name} {self.kind}"]
        for labels, value in self.samples:
            rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            lines.append(
                f"{sample_name}{{{rendered}}} {_number(value)}"
                if rendered
                else f"{sample_name} {_number(value)}"
            )
        return "\n".join(lines)


class MetricsExporter:
    """Keeps running totals of the agent's readings and publishes them as Prometheus text."""

    def __init__(self, textfile: Path | None = None, port: int = 0, host: str = "127.0.0.1") -> None:
        self.textfile = textfile
        self._lock = threading.Lock()
        self._totals = {"inferences": 0, "errors": 0, "activations_ok": 0, "activations_failed": 0}
        self._text = ""
        self._server: ThreadingHTTPServer | None = None
        if port:
            self._server = _serve(self, host, port)

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server else None

    def text(self) -> str:
        with self._lock:
            return self._text

    def observe(self, figures: dict[str, Any], *, device_id: str = "", hints_received: int = 0) -> None:
        """Fold one metrics reading (the agent's telemetry record) into the totals and publish."""
        with self._lock:
            for key in self._totals:
                self._totals[key] += int(figures.get(key) or 0)
            self._text = self._render(figures, device_id, hints_received)
            text = self._text
        if self.textfile is not None:
            _write_atomic(self.textfile, text)

    def _render(self, figures: dict[str, Any], device_id: str, hints_received: int) -> str:
        t = self._totals
        families = [
            _Family("ferry_agent_info", "gauge", "The device and the version it runs (value 1)").add(
                1, device_id=device_id, version=str(figures.get("version") or "")
            ),
            _Family("ferry_agent_cpu_seconds", "counter", "CPU time the agent process used").add(
                figures.get("cpu_seconds_total", 0)
            ),
            _Family("ferry_agent_resident_memory_bytes", "gauge", "Resident memory of the agent").add(
                figures.get("rss_bytes", 0)
            ),
            _Family("ferry_agent_disk_free_bytes", "gauge", "Free space where the agent keeps its state").add(
                figures.get("disk_free_bytes", 0)
            ),
            _Family("ferry_agent_inferences", "counter", "Inferences run since the agent started").add(
                t["inferences"]
            ),
            _Family("ferry_agent_inference_errors", "counter", "Inferences that failed").add(t["errors"]),
            _Family("ferry_agent_inference_latency_ms", "gauge", "Inference latency over the last interval")
            .add(figures.get("latency_ms_p50"), quantile="0.5")
            .add(figures.get("latency_ms_p95"), quantile="0.95"),
            _Family("ferry_agent_activations", "counter", "Update activations, by result")
            .add(t["activations_ok"], result="ok")
            .add(t["activations_failed"], result="failed"),
            _Family(
                "ferry_agent_update_state", "gauge", "The update lifecycle's state (1 for the current one)"
            ).add(1, state=str(figures.get("update_state") or "idle")),
            _Family("ferry_agent_restarts", "counter", "Agent restarts counted in its state directory").add(
                figures.get("restarts_total", 0)
            ),
            _Family(
                "ferry_agent_outbox_pending_records", "gauge", "Telemetry records waiting for the gateway"
            ).add(figures.get("outbox_pending", 0)),
            _Family(
                "ferry_agent_outbox_dropped_records", "counter", "Records dropped because the outbox was full"
            ).add(figures.get("outbox_dropped_total", 0)),
            _Family("ferry_agent_hints_received", "counter", "Hints pushed by the gateway").add(
                hints_received
            ),
            _Family(
                "ferry_agent_last_reading_timestamp_seconds", "gauge", "When these figures were read"
            ).add(round(time.time(), 3)),
        ]
        return "\n".join(f.render() for f in families) + "\n"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _write_atomic(path: Path, text: str) -> None:
    """A sibling temporary file renamed over the target: readers see the old or the new, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _serve(exporter: MetricsExporter, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = exporter.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - scrapes are not log lines
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
