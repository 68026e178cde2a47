"""What the end-to-end tests share: a PostgreSQL database of a test's own, Python run in a
``manage.py shell`` on the stack's settings (an organisation with an admin, queries), and waiting
on a condition while the stack's processes stay alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from ferry_cloud.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
# A script's answer is the last line starting with this (Django and libraries print too).
RESULT = "RESULT "
RESULT_PRELUDE = f"import json\ndef result(value):\n    print({RESULT!r} + json.dumps(value))\n"


@contextmanager
def own_database(prefix: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database beside the suite's; dropped afterwards even
    if a process of the test still holds a connection to it."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    base_url = os.environ["FERRY_DATABASE_URL"].rsplit("/", 1)[0]
    with psycopg.connect(base_url + "/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base_url}/{name}"
    finally:
        with psycopg.connect(base_url + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def wait_until(what: str, check: Callable[[], object], stack: Stack, timeout: float = 40.0):
    """check()'s first truthy result, polled every 0.5 s; fails naming ``what`` (and the logs)
    after ``timeout``, or at once when one of the stack's processes has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; logs in {stack.log_dir}")


def enrolment_bundle_for(token: str, port: int, enrol_port: int) -> str:
    """The bundle an agent enrols with at a gateway this test serves in-process on loopback
    (build_server(f"127.0.0.1:{port}", enrol_address=f"127.0.0.1:{enrol_port}"))."""
    from fleet.services import enrolment_bundle

    return enrolment_bundle(
        token=token, gateway_address=f"127.0.0.1:{port}", enrol_address=f"127.0.0.1:{enrol_port}"
    )


def manage_shell(env: dict[str, str], script: str, timeout: float = 300) -> dict:
    """Run script in ``manage.py shell`` with exactly env; it answers with ``result({...})``."""
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", RESULT_PRELUDE + script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [line[len(RESULT) :] for line in done.stdout.splitlines() if line.startswith(RESULT)]
    assert answers, f"the script gave no result; its output ends with:\n{done.stdout[-2000:]}"
    return json.loads(answers[-1])


BOOTSTRAP = """
import os
from django.core.management import call_command
from accounts.services import organisation_ensure, user_ensure_admin
call_command("migrate", verbosity=0)
org = organisation_ensure(name=os.environ["E2E_ORGANISATION"])
_, token = user_ensure_admin(organisation=org, username="admin", password=os.environ["ADMIN_PASSWORD"])
result({"token": token})
"""


def bootstrap_admin(env: dict[str, str], organisation: str, password: str = "pw") -> str:
    """Migrate the stack's database and ensure an organisation with an admin; its API token.
    The password travels in the environment, never on a command line (logs may show those)."""
    return manage_shell({**env, "E2E_ORGANISATION": organisation, "ADMIN_PASSWORD": password}, BOOTSTRAP)[
        "token"
    ]
