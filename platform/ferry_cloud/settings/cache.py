"""Django's cache: Redis when REDIS_URL is set (shared by every process), else process memory.

The API's rate limits count in it (ferry_cloud/throttling.py): with Redis, every web worker and
replica shares one count per caller; the embedded demo (no Redis) counts per process.
"""

from __future__ import annotations

import os

_REDIS_URL = os.environ.get("REDIS_URL", "")
if _REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _REDIS_URL,
            "KEY_PREFIX": "ferry",
            # a slow or absent Redis fails the call fast; the rate limit then fails open
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "ferry"}}
