"""The agent's opt-in local metrics: the exporter's text, its atomic textfile, its loopback port,
and a real `ferry-agent run` process writing both against a gateway double."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from ferry_cloud.stack import free_port

from agent.metrics_export import MetricsExporter
from deploy.package import generate_keypair
from tests.agent.double import DEVICE_ID, AgentProcess, GatewayDouble, serve, wait_for

READING = {
    "version": "v1",
    "inferences": 7,
    "errors": 1,
    "latency_ms_p50": 2.5,
    "latency_ms_p95": 4.0,
    "cpu_seconds_total": 1.25,
    "rss_bytes": 40_000_000,
    "disk_free_bytes": 10_000_000_000,
    "activations_ok": 1,
    "activations_failed": 0,
    "update_state": "idle",
    "restarts_total": 2,
    "outbox_pending": 3,
    "outbox_dropped_total": 0,
}


def _samples(text: str) -> dict[str, float]:
    """{'name{labels}': value} for every sample line; every line must be valid exposition syntax."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$", line), line
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$", line)
        assert match, line
        samples[match.group(1)] = float(match.group(2))
    return samples


def test_totals_accumulate_and_the_textfile_is_replaced_whole(tmp_path: Path):
    path = tmp_path / "textfile" / "ferry_agent.prom"
    exporter = MetricsExporter(path)
    exporter.observe(READING, device_id="d-1", hints_received=2)
    exporter.observe({**READING, "inferences": 3, "errors": 0}, device_id="d-1", hints_received=5)
    samples = _samples(path.read_text())
    assert samples["ferry_agent_inferences_total"] == 10
    assert samples["ferry_agent_inference_errors_total"] == 1
    assert samples['ferry_agent_activations_total{result="ok"}'] == 2
    assert samples["ferry_agent_hints_received_total"] == 5
    assert samples["ferry_agent_resident_memory_bytes"] == 40_000_000
    assert samples['ferry_agent_update_state{state="idle"}'] == 1
    assert samples['ferry_agent_info{device_id="d-1",version="v1"}'] == 1
    assert samples['ferry_agent_inference_latency_ms{quantile="0.95"}'] == 4.0
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["ferry_agent.prom"]  # no temporary file left


def test_the_port_serves_the_same_text_on_loopback_only():
    exporter = MetricsExporter(port=free_port())
    try:
        exporter.observe(READING, device_id="d-1")
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert response.read().decode() == exporter.text()
        assert exporter._server.server_address[0] == "127.0.0.1"
    finally:
        exporter.close()


def test_a_running_agent_writes_its_textfile_and_serves_its_port(tmp_path: Path):
    double = GatewayDouble(generate_keypair())
    server, port = serve(double)
    textfile = tmp_path / "node-exporter" / "ferry_agent.prom"
    metrics_port = free_port()
    agent = AgentProcess(
        tmp_path / "agent",
        port,
        extra=["--metrics-textfile", str(textfile), "--metrics-port", str(metrics_port)],
    )
    try:
        wait_for(lambda: textfile.exists(), 60, "the metrics textfile", agent)
        samples = _samples(textfile.read_text())
        assert samples[f'ferry_agent_info{{device_id="{DEVICE_ID}",version=""}}'] == 1
        assert samples["ferry_agent_resident_memory_bytes"] > 1_000_000
        assert samples["ferry_agent_cpu_seconds_total"] > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            served = _samples(response.read().decode())
        assert "ferry_agent_outbox_pending_records" in served
        assert agent.stop() == 0
    finally:
        if agent.process.poll() is None:
            agent.kill()
        server.stop(grace=None)
