"""Sources: a tailed file, a UNIX socket and a watched directory, waited on through their readiness."""

from __future__ import annotations

import os
import queue
import shutil
import socket
import stat
import sys
import tempfile
import threading
from pathlib import Path

from agent.stream import source_lines


class _Reader:
    """Reads a source on its own thread; the test waits on the source's readiness and on lines."""

    def __init__(self, source: dict, poll: float = 0.02) -> None:
        self.stop, self.ready = threading.Event(), threading.Event()
        self.lines: queue.Queue[str] = queue.Queue()
        self.idle = threading.Event()  # set when the source has yielded everything it had
        self._thread = threading.Thread(target=self._read, args=(source, poll))
        self._thread.start()
        assert self.ready.wait(10), "the source never became ready"

    def _read(self, source: dict, poll: float) -> None:
        for line in source_lines(source, self.stop, poll, ready=self.ready):
            if line:
                self.lines.put(line)
            else:  # "" means "nothing new right now"
                self.idle.set()

    def take(self, n: int) -> list[str]:
        return [self.lines.get(timeout=10) for _ in range(n)]

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()


def test_file_source_tails_appended_lines_and_follows_rotation(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"old": true}\n')
    reader = _Reader({"type": "file", "path": str(path)})  # ready: open and at the end
    try:
        with open(path, "a") as f:
            f.write('{"n": 1}\n{"n":')
            f.flush()
            assert reader.take(1) == ['{"n": 1}\n']
            reader.idle.clear()
            assert reader.idle.wait(10)  # the source has read the partial line, and holds it
            f.write(" 2}\n")
        assert reader.take(1) == ['{"n": 2}\n']
        path.rename(tmp_path / "events.jsonl.1")
        path.write_text('{"n": 3}\n')
        assert reader.take(1) == ['{"n": 3}\n']
    finally:
        reader.close()


def test_a_file_created_after_the_source_started_is_read_from_its_start(tmp_path: Path):
    path = tmp_path / "late.jsonl"
    reader = _Reader({"type": "file", "path": str(path)})
    try:
        # written in one go before the source's next look: nothing of it may be skipped
        path.write_text('{"n": 1}\n{"n": 2}\n')
        assert reader.take(2) == ['{"n": 1}\n', '{"n": 2}\n']
    finally:
        reader.close()


def test_unix_socket_and_directory_sources(tmp_path: Path):
    sock_path = str(tmp_path / "in.sock")
    reader = _Reader({"type": "unix_socket", "path": sock_path})  # ready: listening
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(sock_path)
            client.sendall(b'{"a": 1}\n{"a": 2}\n')
        assert reader.take(2) == ['{"a": 1}\n', '{"a": 2}\n']
    finally:
        reader.close()
    assert not Path(sock_path).exists()  # nobody listens any more: no path to be refused at

    (tmp_path / "drop").mkdir()
    (tmp_path / "drop" / "1.jsonl").write_text('{"b": 1}\n')
    reader = _Reader({"type": "directory", "path": str(tmp_path / "drop")})
    try:
        assert reader.take(1) == ['{"b": 1}\n']
        (tmp_path / "drop" / "2.jsonl").write_text('{"b": 2}\n')
        assert reader.take(1) == ['{"b": 2}\n']
    finally:
        reader.close()


def test_a_unix_socket_path_appears_only_once_it_listens(tmp_path: Path):
    """The CI flake: a producer that connects as soon as the path exists was refused, because
    bind() creates the path before listen().  This stops the source's thread just before its
    listen() call (a profile hook sees every C call) and connects then, as such a producer
    would: with bind-then-listen at the public path the connection is refused."""
    sock_path = str(tmp_path / "in.sock")
    Path(sock_path).write_text("a stale file a previous run left behind")
    seen_before_listen: list[str] = []

    def before_listen(frame, event, arg) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "listen":
            seen_before_listen.append(_connect_outcome(sock_path))

    stop, ready = threading.Event(), threading.Event()

    def read() -> None:
        sys.setprofile(before_listen)  # this thread only
        try:
            for _ in source_lines({"type": "unix_socket", "path": sock_path}, stop, ready=ready):
                pass
        finally:
            sys.setprofile(None)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        assert ready.wait(10)
        assert seen_before_listen == ["stale"]  # a client still found only the old file
        assert _connect_outcome(sock_path) == "connected"
    finally:
        stop.set()
        thread.join(timeout=10)


def _connect_outcome(path: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        try:
            client.connect(path)
        except FileNotFoundError:
            return "missing"
        except ConnectionRefusedError:
            return "refused" if stat.S_ISSOCK(os.stat(path).st_mode) else "stale"
    return "connected"


def test_a_socket_path_too_long_for_a_hidden_name_still_listens():
    """sockaddr_un holds 107 bytes: a path that fits but leaves no room for the hidden name is
    bound in place, and ``ready`` still says when it listens."""
    directory = tempfile.mkdtemp(dir="/tmp")  # short: pytest's tmp_path may not leave room
    try:
        sock_path = os.path.join(directory, "s" * (104 - len(os.fsencode(directory))))
        assert len(os.fsencode(sock_path)) == 105
        reader = _Reader({"type": "unix_socket", "path": sock_path})
        try:
            assert _connect_outcome(sock_path) == "connected"
        finally:
            reader.close()
        assert not os.path.exists(sock_path)
    finally:
        shutil.rmtree(directory)
