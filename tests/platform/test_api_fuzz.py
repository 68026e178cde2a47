"""Schemathesis against Ferry's own OpenAPI document: every operation, a bounded number of
generated requests each (valid and invalid), as an admin with rows to find; no answer may be a
5xx, and every answer must have a documented status, content type and body shape."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from ferry_cloud.wsgi import application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def kept_connection(db):
    """The WSGI app closes the database connection after each request, as it should in production;
    here that would end the test's transaction (Django's own test client disconnects it too)."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def short_streams(settings):
    """The event stream answers its frames and ends at once instead of after 55 s."""
    settings.FERRY_SSE_MAX_SECONDS = 0
    settings.FERRY_SSE_POLL_SECONDS = 0


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_every_answer_is_documented(case, admin, kept_connection, short_streams):
    case.call_and_validate(headers={"Authorization": f"Token {admin[1]}"}, checks=CHECKS)
