# The console shows what the platform tests build: share their fixtures.
from tests.platform.conftest import admin, api, operator, org, outsider, ready_version, viewer  # noqa: F401
