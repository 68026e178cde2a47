"""Driving Debian's headless Chromium for the console's browser tests.

Every page these tests open runs behind request interception: a request to anything but the
loopback server is refused and recorded, and so is any Content-Security-Policy violation the
page reports; the fixture fails the test on either. Screenshots (1280x800) go to
FERRY_ARTIFACTS_DIR, or var/screenshots in the repository (gitignored, never committed).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Without these, Chromium tries to reach Google's services, which this network refuses.
QUIET_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def artifacts_dir() -> Path:
    default = Path(__file__).resolve().parents[2] / "var" / "screenshots"
    path = Path(os.environ.get("FERRY_ARTIFACTS_DIR") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Offline:
    """What a page tried that it must not: requests off this machine, CSP violations."""

    outside: list[str] = field(default_factory=list)
    csp_violations: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)  # what confirm() asked

    def route(self, route) -> None:
        url = route.request.url
        parsed = urlparse(url)
        if parsed.scheme in ("http", "https", "ws", "wss") and parsed.hostname not in LOOPBACK:
            self.outside.append(url)
            route.abort("blockedbyclient")
            return
        self.loaded.append(url)
        route.continue_()

    def console(self, message) -> None:
        if "Content Security Policy" in message.text:
            self.csp_violations.append(message.text)


def open_page(playwright, offline: Offline):
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=QUIET_FLAGS)
    context = browser.new_context(viewport=VIEWPORT)
    context.route("**/*", offline.route)
    page = context.new_page()
    page.on("console", offline.console)
    return browser, page


def screenshot(page, name: str) -> Path:
    path = artifacts_dir() / (re.sub(r"[^\w.-]+", "-", name).strip("-") + ".png")
    page.screenshot(path=str(path), full_page=False)
    return path


def login(page, live_server, username: str = "alice", password: str = "correct horse") -> None:
    page.goto(f"{live_server.url}/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
