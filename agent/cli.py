"""`ferry-agent`: run the device daemon in the foreground with readable logs."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from agent.daemon import Agent, AgentConfig
from agent.errors import AgentError


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--label takes key=value, got {pair!r}")
        labels[key] = value
    return labels


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferry-agent", description="Ferry's device agent.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="enrol if needed, then run until SIGTERM/SIGINT")
    run.add_argument("--gateway", required=True, help="host:port of the control plane's gRPC gateway")
    run.add_argument("--state-dir", type=Path, required=True, help="where the agent keeps its state")
    run.add_argument("--token", default="", help="one-time enrolment token (first run only)")
    run.add_argument("--name", default=None, help="device name shown in the console")
    run.add_argument("--label", action="append", default=[], help="key=value, repeatable")
    run.add_argument("--hardware", default="generic")
    run.add_argument("--event-rate", type=float, default=20.0, help="synthetic events per second")
    run.add_argument("--metrics-interval", type=float, default=5.0)
    run.add_argument("--upload-interval", type=float, default=2.0)
    run.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s agent: %(message)s")
    config = AgentConfig(
        gateway=args.gateway,
        state_dir=args.state_dir,
        token=args.token,
        labels=_labels(args.label),
        hardware=args.hardware,
        event_rate=args.event_rate,
        metrics_interval=args.metrics_interval,
        upload_interval=args.upload_interval,
    )
    if args.name:
        config.name = args.name
    agent = Agent(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    try:
        agent.run()
    except AgentError as exc:
        logging.getLogger("agent").error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
