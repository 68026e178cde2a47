"""`ferry-agent`: enrol from a bundle, and run the device daemon in the foreground with readable logs."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from agent.daemon import Agent, AgentConfig
from agent.errors import AgentError
from agent.install import DownloadRules


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
    enrol = sub.add_parser("enrol", help="enrol with an enrolment bundle (pins its CA), then exit")
    enrol.add_argument("bundle", help="the one-line enrolment bundle: ferry-enrol-1:...")
    run = sub.add_parser("run", help="enrol if needed, then run until SIGTERM/SIGINT")
    run.add_argument(
        "--gateway", default="", help="host:port of the gateway's mutual-TLS port (default: from the bundle)"
    )
    run.add_argument("--bundle", default="", help="the enrolment bundle, ferry-enrol-1:... (first run only)")
    for command in (enrol, run):
        command.add_argument("--state-dir", type=Path, required=True, help="where the agent keeps its state")
        command.add_argument("--name", default=None, help="device name shown in the console")
        command.add_argument("--label", action="append", default=[], help="key=value, repeatable")
        command.add_argument("--hardware", default="generic")
    run.add_argument(
        "--device-class", default="", help="refuse packages signed for another class (default: --hardware)"
    )
    run.add_argument("--event-rate", type=float, default=20.0, help="synthetic events per second")
    run.add_argument("--metrics-interval", type=float, default=5.0)
    run.add_argument("--upload-interval", type=float, default=2.0)
    run.add_argument(
        "--probation-seconds",
        type=float,
        default=120.0,
        help="after an update, this many restarts-free seconds end the crash-loop watch",
    )
    run.add_argument(
        "--outbox-max-records", type=int, default=100_000, help="oldest dropped (and counted) past it"
    )
    run.add_argument("--download-deadline", type=float, default=600.0, help="seconds per download attempt")
    run.add_argument(
        "--min-download-speed", type=float, default=1024.0, help="bytes/s over 30 s, else resume later"
    )
    run.add_argument(
        "--reserve-bytes", type=int, default=16 << 20, help="free disk space an update must leave untouched"
    )
    run.add_argument(
        "--no-hints", action="store_true", help="do not hold a WatchHints stream open (poll only)"
    )
    run.add_argument(
        "--metrics-textfile",
        type=Path,
        default=None,
        help="write Prometheus metrics to this file (node-exporter textfile format) every metrics interval",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics",
    )
    run.add_argument("--log-level", default="INFO")
    run.add_argument(
        "--llm-port",
        type=int,
        default=0,
        help="serve the active LLM package's chat API on http://127.0.0.1:PORT/v1 (0: off)",
    )
    run.add_argument(
        "--llm-kv-int8",
        action="store_true",
        help="keep the served LLM's KV cache as int8 (see serve-llm --kv-int8)",
    )
    serve_llm = sub.add_parser(
        "serve-llm", help="serve a converted LLM package's chat API, without a control plane"
    )
    serve_llm.add_argument(
        "package", type=Path, help="an LLM package: a .ferry archive or an unpacked directory"
    )
    serve_llm.add_argument("--port", type=int, default=8080, help="port on --host (default: 8080)")
    serve_llm.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve_llm.add_argument("--unix-socket", type=Path, default=None, help="serve on this UNIX socket instead")
    serve_llm.add_argument(
        "--public-key", type=Path, default=None, help="verify the archive's signature with this Ed25519 key"
    )
    serve_llm.add_argument(
        "--model-name", default="", help="the model's name in the API (default: the file's)"
    )
    serve_llm.add_argument("--queue", type=int, default=8, help="requests that may wait; more get 429")
    serve_llm.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=PACKAGE",
        help="also serve a LoRA adapter package of this base as model NAME (repeatable)",
    )
    serve_llm.add_argument(
        "--kv-int8",
        action="store_true",
        help="keep the KV cache as int8 (per head and position scales): ~3.8x less cache memory, "
        "a small accuracy cost (README, LLM section); default: the package's choice, else fp32",
    )
    serve_llm.add_argument(
        "--threads",
        type=_positive,
        default=None,
        help="cores a request's kernels may use (default: FERRY_LLM_THREADS, else 1)",
    )
    serve_llm.add_argument("--log-level", default="INFO")
    status = sub.add_parser("status", help="print what the agent's state directory says, as JSON")
    status.add_argument("--state-dir", type=Path, required=True)
    return p


def status(state_dir: Path) -> dict:
    """The device's own view: enrolment, running version, update in progress, refusals, outbox."""
    import sqlite3

    from agent.files import read_json

    credential = read_json(state_dir / "credential.json") or {}
    outbox = {"pending": None, "last_seq": None}
    if (state_dir / "outbox.sqlite").exists():
        db = sqlite3.connect(f"file:{state_dir / 'outbox.sqlite'}?mode=ro", uri=True)
        try:
            outbox = {
                "pending": db.execute("SELECT COUNT(*) FROM records").fetchone()[0],
                "last_seq": db.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()[0] - 1,
            }
        finally:
            db.close()
    return {
        "device_id": credential.get("device_id"),
        "gateway": credential.get("gateway"),
        "running": read_json(state_dir / "running.json") or {},
        "update": read_json(state_dir / "update.json") or {"state": "idle"},
        "refused": read_json(state_dir / "refused.json") or {},
        "outbox": outbox,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "status":
        import json

        print(json.dumps(status(args.state_dir), indent=2, sort_keys=True))
        return 0
    if args.command == "enrol":
        return _enrol(args)
    if args.command == "serve-llm":
        return _serve_llm(args)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s agent: %(message)s")
    config = AgentConfig(
        gateway=args.gateway,
        state_dir=args.state_dir,
        bundle=args.bundle,
        labels=_labels(args.label),
        hardware=args.hardware,
        device_class=args.device_class,
        event_rate=args.event_rate,
        metrics_interval=args.metrics_interval,
        upload_interval=args.upload_interval,
        probation_seconds=args.probation_seconds,
        outbox_max_records=args.outbox_max_records,
        download_rules=DownloadRules(
            deadline_seconds=args.download_deadline,
            min_bytes_per_second=args.min_download_speed,
            reserve_bytes=args.reserve_bytes,
        ),
        watch_hints=not args.no_hints,
        metrics_textfile=args.metrics_textfile,
        metrics_port=args.metrics_port,
        llm_port=args.llm_port,
        llm_kv_cache="int8" if args.llm_kv_int8 else None,
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


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _serve_llm(args: argparse.Namespace) -> int:
    from agent.llm_api.standalone import PackageError, read_public_key, serve
    from engine.llm.errors import LlmError

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s serve-llm: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM ends serving as Ctrl-C does
    try:
        key = read_public_key(args.public_key) if args.public_key else None
        serve(
            args.package,
            host=args.host,
            port=args.port,
            unix_socket=args.unix_socket,
            public_key=key,
            name=args.model_name,
            queue_bound=max(args.queue, 0),
            adapters=_adapters(args.adapter),
            kv_cache="int8" if args.kv_int8 else None,
            threads=args.threads,
        )
    except (PackageError, LlmError, OSError) as exc:
        logging.getLogger("serve-llm").error("%s", exc)
        return 2
    return 0


def _positive(value: str) -> int:
    """argparse type: a whole number of at least 1."""
    if not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value!r}")
    return int(value)


def _adapters(values: list[str]) -> dict[str, Path]:
    from agent.llm_api.standalone import PackageError

    found = {}
    for value in values:
        name, _, path = value.partition("=")
        if not name or not path:
            raise PackageError(f"--adapter {value!r}: give NAME=PACKAGE")
        found[name] = Path(path)
    return found


def _enrol(args: argparse.Namespace) -> int:
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s agent: %(message)s")
    agent = Agent(
        AgentConfig(
            gateway="",
            state_dir=args.state_dir,
            bundle=args.bundle,
            labels=_labels(args.label),
            hardware=args.hardware,
        )
    )
    if args.name:
        agent.config.name = args.name
    try:
        agent.ensure_enrolled()
    except AgentError as exc:
        logging.getLogger("agent").error("%s", exc)
        return 2
    print(agent.device_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
