"""ferryctl's entry point: the command tree, login, and how failures exit.

Exit codes: 0 done; 2 the server refused the request (4xx) or the command line/config is wrong;
1 anything else (5xx, server unreachable, a conversion that failed, a release that did not complete)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ferryctl.client import ApiError, Ferry, TransportError
from ferryctl.config import Config, ConfigError, config_save
from ferryctl.events import events_list, webhooks
from ferryctl.fleet import devices, tokens
from ferryctl.output import err, out
from ferryctl.registry import models, versions
from ferryctl.releases import releases

app = typer.Typer(
    name="ferryctl",
    help="Ferry from the command line: models, versions, releases, devices, enrolment tokens, events.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(models, name="models")
app.add_typer(versions, name="versions")
app.add_typer(releases, name="releases")
app.add_typer(devices, name="devices")
app.add_typer(tokens, name="tokens")
app.command("events")(events_list)
app.add_typer(webhooks, name="webhooks")


@app.command("login")
def login(
    url: Annotated[str, typer.Option(help="The server, e.g. https://ferry.example.com.")],
    token: Annotated[str, typer.Option(help="Your API token (the console shows it once).")],
    check: Annotated[bool, typer.Option(help="Check the token against the server first.")] = True,
) -> None:
    """Save the server and token to ~/.config/ferry/config.toml (mode 0600)."""
    if not url.startswith(("http://", "https://")):
        raise typer.BadParameter("must start with http:// or https://", param_hint="--url")
    config = Config(url=url.rstrip("/"), token=token)
    if check:
        ferry = Ferry(config)
        try:
            next(ferry.pages("/models/", limit=1), None)
        finally:
            ferry.close()
    out.print(f"Saved to {config_save(config)}")


def main() -> None:
    try:
        app()
    except ApiError as exc:
        err.print(exc.describe(), markup=False)
        sys.exit(exc.exit_code)
    except ConfigError as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(2)
    except TransportError as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(1)
