"""/metrics for the web app: django-prometheus's request and database metrics, plus domain gauges.

The domain gauges (devices, versions, releases, conversion jobs, update failures) are computed
by a collector at scrape time from the database.  It lives in a registry of its own, added to
the output once per scrape: under gunicorn with PROMETHEUS_MULTIPROC_DIR, the per-process
metrics come from the shared directory (summed over workers) and the domain figures are
computed once by whichever worker serves the scrape, never written per process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ferry_cloud.observability import selectors

log = structlog.get_logger("ferry.metrics")


class DomainCollector(Collector):
    """Fleet figures read through selectors on every scrape; a failing read is reported, not raised."""

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        failed = 0
        for produce in (self._devices, self._versions, self._releases, self._jobs, self._failures):
            try:
                yield from produce()
            except Exception as exc:  # a database hiccup must not cost the whole scrape
                failed += 1
                log.warning("domain metrics read failed", part=produce.__name__.strip("_"), error=str(exc))
        yield GaugeMetricFamily(
            "ferry_domain_scrape_errors", "Domain metric groups that could not be read this scrape", failed
        )
        yield GaugeMetricFamily(
            "ferry_domain_scrape_duration_seconds",
            "Time spent computing the domain metrics",
            time.perf_counter() - started,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())  # nothing is read at registration time

    @staticmethod
    def _devices() -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "ferry_devices", "Enrolled devices by state (online: checked in recently)", labels=["state"]
        )
        by_state = selectors.devices_by_state(online_seconds=settings.FERRY_DEVICE_ONLINE_SECONDS)
        for state, n in sorted(by_state.items()):
            family.add_metric([state], n)
        yield family

    @staticmethod
    def _versions() -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "ferry_devices_by_version",
            "Live devices by the model version they run (empty: none yet)",
            labels=["organisation", "model", "version"],
        )
        for row in selectors.devices_by_version():
            family.add_metric([row.organisation, row.model, row.version], row.devices)
        yield family

    @staticmethod
    def _releases() -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "ferry_release_devices",
            "Live devices of an active or paused release's organisation, on its version or another",
            labels=["organisation", "release_id", "release", "state", "version", "running"],
        )
        for r in selectors.live_release_device_counts():
            labels = [r.organisation, r.release_id, r.release, r.state, r.version]
            family.add_metric([*labels, "release_version"], r.on_release_version)
            family.add_metric([*labels, "other_version"], r.on_other_versions)
        yield family

    @staticmethod
    def _jobs() -> Iterator[Metric]:
        family = GaugeMetricFamily("ferry_conversion_jobs", "Conversion jobs by status", labels=["status"])
        for status, n in sorted(selectors.conversion_jobs_by_status().items()):
            family.add_metric([status], n)
        yield family

    @staticmethod
    def _failures() -> Iterator[Metric]:
        # stored records only accumulate, so this is a counter: rate() gives failures per second
        family = CounterMetricFamily(
            "ferry_device_update_failures",
            "Failed updates the agents reported, by stage and outcome (refused, rolled_back)",
            labels=["organisation", "stage", "outcome"],
        )
        for r in selectors.update_failures():
            family.add_metric([r.organisation, r.stage, r.outcome], r.records)
        yield family


DOMAIN_REGISTRY = CollectorRegistry(auto_describe=False)
DOMAIN_REGISTRY.register(DomainCollector())


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def process_metrics() -> bytes:
    """Request, latency and database metrics: this process's, or every worker's in multiprocess mode."""
    if multiprocess_mode():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)


def metrics_view(request: HttpRequest) -> HttpResponse:
    body = process_metrics() + generate_latest(DOMAIN_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
