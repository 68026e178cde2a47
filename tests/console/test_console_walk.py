"""Every console page is reachable by links from the dashboard, and none loads from outside.

The walk follows every same-origin link a release manager sees, from the dashboard outwards,
each kind of page (its URL name) up to twice; every page must answer 200, and the set of
kinds reached must cover every page the console serves for GET. The offline_page fixture
fails the test on any request off this machine or any Content-Security-Policy violation.
"""

from __future__ import annotations

from collections import deque
from urllib.parse import urlparse

import pytest
from django.urls import Resolver404, resolve
from fleet.services import device_enrol, device_group_create, enrolment_token_create
from releases.services import release_create

from tests.console.browser import login, screenshot
from tests.platform.test_roles import endpoints

pytestmark = [pytest.mark.browser]
# an action, where we came from, JSON the pages fetch, and the parts htmx re-fetches
NOT_PAGES = {
    "console:logout",
    "console:login",
    "schema",
    "console:release-preview",
    "console:dashboard-live",
    "console:model-live",
    "console:version-job",
    "console:version-sample",  # an image the version page shows (test_console_diffusion_sample.py)
    "console:device-live",
    "console:release-live",
    "console:release-canary-chart",
    "console:redoc-bundle",
}
PER_KIND = 2


@pytest.fixture
def world(transactional_db, org, admin, ready_version):
    token = enrolment_token_create(organisation=org, labels={"site": "lab"}).token
    device = device_enrol(token=token, name="lab-1", attributes={"hardware": "rpi4"}, labels={"site": "lab"})
    device_group_create(organisation=org, name="lab", kind="static", device_ids=[str(device.device.pk)])
    release_create(
        organisation=org,
        version=ready_version,
        name="to the lab",
        target={"labels": {"site": "lab"}},
        actor=admin[0],
        start=True,
    )


def _get_pages() -> set[str]:
    """The URL names of every console page a person opens with GET, and the API docs."""
    names = {e.name for e in endpoints() if e.name.startswith("console:") and "GET" in _roles(e)}
    return (names | {"api-docs"}) - NOT_PAGES


def _roles(endpoint) -> dict:
    return getattr(endpoint.callback, "required_roles", {"GET": None})


def test_every_page_is_reachable_from_the_dashboard(world, live_server, offline_page):
    page = offline_page
    login(page, live_server)
    seen_kinds: dict[str, int] = {}
    visited: set[str] = set()
    queue = deque([f"{live_server.url}/"])
    failures = []
    while queue:
        url = queue.popleft()
        path = urlparse(url).path
        try:
            kind = resolve(path).view_name
        except Resolver404:
            failures.append(f"{url}: no such page")
            continue
        if url in visited or kind in NOT_PAGES or seen_kinds.get(kind, 0) >= PER_KIND:
            continue
        visited.add(url)
        response = page.goto(url)
        if response is None or response.status != 200:
            failures.append(f"{url}: {response.status if response else 'no answer'}")
            continue
        page.wait_for_load_state("networkidle")  # scripts ran: a CSP violation would be reported
        if seen_kinds.get(kind, 0) == 0:
            screenshot(page, f"walk-{kind.replace(':', '-')}")
        seen_kinds[kind] = seen_kinds.get(kind, 0) + 1
        for href in page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)"):
            target = urlparse(href)
            if target.netloc == urlparse(live_server.url).netloc and not target.path.startswith("/static/"):
                queue.append(href.split("#")[0])
    assert not failures, failures
    missing = _get_pages() - set(seen_kinds)
    assert not missing, f"pages no link leads to: {sorted(missing)}"
