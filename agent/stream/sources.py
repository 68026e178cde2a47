"""Sources: a tailed file, a UNIX socket, stdin or a watched directory, as lines."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def source_lines(
    source: dict[str, Any],
    stop: threading.Event,
    poll: float = 0.2,
    ready: threading.Event | None = None,
) -> Iterator[str]:
    """Lines from a tailed file, a UNIX socket (one client at a time), stdin or a watched directory.

    Live sources yield "" whenever they are idle for a poll period (see Pipeline.run).

    ``ready`` is set once the source takes input: from then on, whatever is appended to the
    file, sent to the socket or dropped into the directory is read.  A socket source is
    listening before its path appears, so a producer may also wait for the path."""
    ready = ready if ready is not None else threading.Event()
    kind = source["type"]
    if kind == "stdin":
        ready.set()
        yield from sys.stdin
    elif kind == "file":
        yield from _tail(Path(source["path"]), stop, poll, source.get("from_start", False), ready)
    elif kind == "directory":
        yield from _watch_directory(Path(source["path"]), source.get("pattern", "*"), stop, poll, ready)
    elif kind == "unix_socket":
        yield from _unix_socket(source["path"], stop, ready)


def _tail(
    path: Path, stop: threading.Event, poll: float, from_start: bool, ready: threading.Event
) -> Iterator[str]:
    try:
        f = open(path)  # noqa: SIM115 - reopened on rotation
        if not from_start:
            f.seek(0, os.SEEK_END)
    except FileNotFoundError:
        # Every byte of a file created after the source started is new: read it from its start
        # (seeking to its end would drop what the producer wrote before the next poll).
        ready.set()
        while not stop.is_set():
            try:
                f = open(path)  # noqa: SIM115
                break
            except FileNotFoundError:
                stop.wait(poll)
        else:
            return
    ready.set()  # the file is open and positioned: every line appended from now on is read
    inode = os.fstat(f.fileno()).st_ino
    partial = ""
    try:
        while not stop.is_set():
            line = f.readline()
            if line:
                if line.endswith("\n"):
                    yield partial + line
                    partial = ""
                else:
                    partial += line
                continue
            try:
                if os.stat(path).st_ino != inode:  # rotated: follow the new file from its start
                    f.close()
                    f = open(path)  # noqa: SIM115
                    inode = os.fstat(f.fileno()).st_ino
                    continue
            except FileNotFoundError:
                pass
            yield ""
            stop.wait(poll)
    finally:
        f.close()


def _watch_directory(
    directory: Path, pattern: str, stop: threading.Event, poll: float, ready: threading.Event
) -> Iterator[str]:
    seen: set[str] = set()
    ready.set()  # the first scan has not run yet: every file present or dropped later is read
    while not stop.is_set():
        for path in sorted(directory.glob(pattern)):
            if path.name in seen or not path.is_file() or path.name.startswith("."):
                continue
            seen.add(path.name)
            with open(path) as f:
                yield from f
        yield ""
        stop.wait(poll)


# sockaddr_un's path holds 108 bytes with the terminating NUL on Linux
_UNIX_PATH_MAX = 107


def listen_unix(path: str) -> socket.socket:
    """A UNIX stream socket listening at ``path``, which appears only once it listens.

    bind() creates the path and listen() comes after it: a producer that connects as soon as
    the path exists would be refused in between.  So bind and listen under a hidden name in
    the same directory, then rename it onto ``path`` (atomic, and the socket follows its inode).
    """
    directory, name = os.path.split(path)
    hidden = os.path.join(directory, f".{name}.{os.getpid()}-{threading.get_ident() % 10**6}")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(os.fsencode(hidden)) > _UNIX_PATH_MAX:
            # no room for the hidden name: bind in place; `ready` still tells when it listens
            Path(path).unlink(missing_ok=True)
            server.bind(path)
            server.listen(1)
            return server
        Path(hidden).unlink(missing_ok=True)
        server.bind(hidden)
        server.listen(1)
        os.replace(hidden, path)  # also replaces a stale socket a previous run left behind
    except BaseException:
        server.close()
        Path(hidden).unlink(missing_ok=True)
        raise
    return server


def _unix_socket(path: str, stop: threading.Event, ready: threading.Event) -> Iterator[str]:
    server = listen_unix(path)
    inode = os.stat(path).st_ino
    server.settimeout(0.5)
    ready.set()
    try:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                yield ""
                continue
            conn.settimeout(0.5)
            with conn:
                pending = b""
                while not stop.is_set():
                    try:
                        data = conn.recv(65536)
                    except TimeoutError:
                        yield ""
                        continue
                    if not data:
                        break
                    *complete, pending = (pending + data).split(b"\n")
                    for raw in complete:
                        yield raw.decode("utf-8", "replace") + "\n"
    finally:
        server.close()
        _remove_own_socket(path, inode)


def _remove_own_socket(path: str, inode: int) -> None:
    """Remove the path once nobody listens there, unless another source has replaced it since."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass
