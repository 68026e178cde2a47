"""Rate limits: per API token (Redis-backed, shared by every process), per IP when anonymous,
with the RateLimit-* headers on every answer and a 429 in the error format with Retry-After."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from ferry_cloud.throttling import Rate, parse_rate
from rest_framework.test import APIClient

from tests.platform.conftest import member_of

ROOT = Path(__file__).resolve().parents[2]


def _limits(response) -> tuple[int, int, int]:
    return (
        int(response["RateLimit-Limit"]),
        int(response["RateLimit-Remaining"]),
        int(response["RateLimit-Reset"]),
    )


@pytest.mark.django_db
def test_each_token_has_its_own_budget_counted_in_redis(api, org, settings):
    settings.FERRY_API_RATE = "3/hour"
    answers = [api.get("/api/v1/models/") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [_limits(a)[:2] for a in answers] == [(3, 2), (3, 1), (3, 0)]
    assert all(0 < _limits(a)[2] <= 3600 for a in answers)
    assert answers[0]["RateLimit-Policy"] == "3;w=3600"

    refused = api.get("/api/v1/models/")
    assert refused.status_code == 429
    assert refused["Content-Type"].startswith("application/json")
    error = json.loads(refused.content)["error"]
    assert error["code"] == "throttled" and "3 requests per 3600 s" in error["message"]
    assert 0 < int(refused["Retry-After"]) <= 3600
    assert _limits(refused)[:2] == (3, 0)
    assert api.post("/api/v1/models/", {"name": "x"}, format="json").status_code == 429  # writes too

    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {member_of(org, 'bob', 'viewer')[1]}")
    assert other.get("/api/v1/models/").status_code == 200  # another token, another count

    # the count lives in the Redis REDIS_URL names, where every worker and replica reads it
    keys = redis.Redis.from_url(os.environ["REDIS_URL"]).keys("ferry:*:ferry:rl:token:*")
    assert len(keys) >= 2, keys


@pytest.mark.django_db
def test_anonymous_callers_are_limited_per_address(settings):
    settings.FERRY_API_ANON_RATE = "2/hour"
    # addresses of this run only: the counts of an earlier run live on in Redis for the hour
    first, second = (APIClient(REMOTE_ADDR=f"198.18.{random.randrange(256)}.{n}") for n in (1, 2))
    docs = "/api/schema/?format=json"  # open to anyone: what an anonymous caller can reach
    assert [first.get(docs).status_code for _ in range(2)] == [200, 200]
    refused = first.get(docs)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert json.loads(refused.content)["error"]["code"] == "throttled"
    assert second.get(docs).status_code == 200


@pytest.mark.django_db
def test_off_means_no_limit_and_no_headers(api, settings):
    settings.FERRY_API_RATE = "off"
    answer = api.get("/api/v1/models/")
    assert answer.status_code == 200 and "RateLimit-Limit" not in answer


def test_rates_parse_or_fail_naming_the_format():
    assert parse_rate("600/min") == Rate(600, 60)
    assert parse_rate("10/s") == Rate(10, 1)
    assert parse_rate("100/5min") == Rate(100, 300)
    assert parse_rate("5000/hour") == Rate(5000, 3600)
    assert parse_rate("off") is None and parse_rate("") is None
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="requests>/<period>"):
        parse_rate("600 per minute")


def test_the_cache_is_redis_with_redis_url_and_process_memory_without():
    assert django_settings.CACHES["default"]["BACKEND"].endswith("RedisCache")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "platform")])
    env["DJANGO_SETTINGS_MODULE"] = "ferry_cloud.settings"
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.CACHES['default']['BACKEND'])"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "django.core.cache.backends.locmem.LocMemCache"


@pytest.mark.django_db
def test_the_openapi_document_declares_429_and_the_headers(api):
    document = api.get("/api/schema/?format=json").json()
    assert set(document["components"]["headers"]) >= {"RateLimit-Limit", "RateLimit-Remaining", "Retry-After"}
    listing = document["paths"]["/api/v1/models/"]["get"]["responses"]
    assert listing["429"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert "Retry-After" in listing["429"]["headers"]
    assert (
        "RateLimit-Remaining" in listing["200"]["headers"] and "Retry-After" not in listing["200"]["headers"]
    )
