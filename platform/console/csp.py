"""A Content-Security-Policy on every response that has none: scripts from this origin only.

The console's pages carry no inline script (the vendored libraries and page scripts are static
files), so an injected ``<script>`` would not run even if escaping ever failed. Inline styles
stay allowed: base.html and Swagger UI use them, and they cannot run code.
"""

from __future__ import annotations

from collections.abc import Callable

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", POLICY)
        return response
