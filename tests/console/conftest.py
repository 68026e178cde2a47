# The console shows what the platform tests build: share their fixtures.
from tests.platform.conftest import admin, api, org, ready_version  # noqa: F401
