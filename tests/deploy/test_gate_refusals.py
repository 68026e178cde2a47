"""Devices that refuse or fail a release are gate failures: evidence, not silence."""

from __future__ import annotations

from deploy.gates import CohortFigures, GateThresholds, evaluate_gate


def test_a_refusal_fails_the_gate_even_when_nobody_reports_telemetry():
    figures = CohortFigures(devices_pending=2, devices_refused=1, refusal_reasons={"device_class": 1})
    result = evaluate_gate(GateThresholds(), figures, None)
    assert not result.passed and not result.pending
    assert result.failures == ("1 device(s) refused or failed the update (device_class: 1)",)
    assert result.figures["devices_refused"] == 1 and result.figures["refusal_reasons"] == {"device_class": 1}


def test_refusals_fail_the_gate_beside_healthy_devices_and_with_every_check_off():
    thresholds = GateThresholds(
        max_activation_failure_rate=None,
        max_error_rate=None,
        max_latency_p95_ratio=None,
        max_restarts_per_device=None,
    )
    figures = CohortFigures(
        devices_reporting=9, inferences=900, devices_refused=2, refusal_reasons={"health_check": 1, "": 1}
    )
    result = evaluate_gate(thresholds, figures, None)
    assert not result.passed
    assert result.failures == ("2 device(s) refused or failed the update (unknown: 1, health_check: 1)",)


def test_no_refusal_and_no_report_is_still_pending():
    result = evaluate_gate(GateThresholds(), CohortFigures(devices_pending=3), None)
    assert result.pending and not result.passed and not result.failures
