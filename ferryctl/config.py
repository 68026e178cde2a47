"""Where the server is and who we are: FERRY_URL / FERRY_TOKEN, else ~/.config/ferry/config.toml."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    """No usable server URL or token; the message says how to give them."""


@dataclass(frozen=True)
class Config:
    url: str
    token: str


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ferry" / "config.toml"


def _read_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"Cannot read {path}: {exc}. Fix it or run `ferryctl login` again.") from exc
    return {k: v for k, v in data.items() if k in ("url", "token") and isinstance(v, str)}


def config_load() -> Config:
    """The environment wins over the file, field by field."""
    stored = _read_file(config_path())
    url = os.environ.get("FERRY_URL") or stored.get("url", "")
    token = os.environ.get("FERRY_TOKEN") or stored.get("token", "")
    if not url:
        raise ConfigError("No server URL: set FERRY_URL or run `ferryctl login --url URL --token TOKEN`.")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"The server URL {url!r} must start with http:// or https://.")
    if not token:
        raise ConfigError("No API token: set FERRY_TOKEN or run `ferryctl login --url URL --token TOKEN`.")
    return Config(url=url.rstrip("/"), token=token)


def _toml_string(value: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters as \\uXXXX."""
    escaped = "".join(
        f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else "\\" + c if c in '"\\' else c
        for c in value
    )
    return f'"{escaped}"'


def config_save(config: Config) -> Path:
    """Write the config file readable by its owner only (it holds a credential)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = f"url = {_toml_string(config.url)}\ntoken = {_toml_string(config.token)}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    path.chmod(0o600)  # an existing file keeps its old mode through os.open
    return path
