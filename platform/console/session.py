"""Signing in for console views, and what a signed-out htmx poll gets instead of a redirect.

The live parts of the dashboard, release, device and job pages are re-fetched by htmx every
2 s. After the session ends (expired, logged out elsewhere, cookie gone) Django's
login_required answers such a fetch with a redirect to the login page; the browser's XHR
follows it quietly and htmx swapped the whole login page into the fragment. Here an htmx
request from a signed-out browser is answered 401 with an ``HX-Redirect`` header instead:
htmx then loads the login page as the whole page (with ``next`` naming the page the person
was on), and no inline script is needed (the console's CSP forbids it). Ordinary requests
still get the redirect.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from urllib.parse import urlsplit, urlunsplit

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme


def login_required_or_401(view: Callable) -> Callable:
    """login_required for pages; 401 + HX-Redirect to the login page for htmx's requests."""
    page = login_required(view)

    @wraps(view)
    def checked(request: HttpRequest, *args, **kwargs):
        if request.headers.get("HX-Request") == "true" and not request.user.is_authenticated:
            return signed_out(request)
        return page(request, *args, **kwargs)

    return checked


def signed_out(request: HttpRequest) -> HttpResponse:
    """The answer to a signed-out htmx request: 401, and where the whole page should go."""
    response = HttpResponse("Your session has ended: log in again.\n", status=401, content_type="text/plain")
    response["HX-Redirect"] = redirect_to_login(_page_of(request)).url
    response["Cache-Control"] = "no-store"
    return response


def _page_of(request: HttpRequest) -> str:
    """The page the poll came from (htmx sends it as HX-Current-URL), as a path on this site;
    the dashboard if it names another site or none (``next`` must never leave this one)."""
    current = request.headers.get("HX-Current-URL", "")
    safe = url_has_allowed_host_and_scheme(
        current, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    parts = urlsplit(current)
    if not current or not safe or not parts.path.startswith("/") or parts.path.startswith("//"):
        return reverse("console:dashboard")
    return urlunsplit(("", "", parts.path, parts.query, ""))
