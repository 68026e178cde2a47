"""The embedded Celery broker (SQLite through kombu's SQLAlchemy transport) without start-up races.

kombu's SQLAlchemy channel creates its tables and its queue rows on first use, guarded by a
lock that only covers threads of one process. When the worker, beat and the web process
start together (the demo, a test stack, a compose file), two of them can both find no
`kombu_queue` row, both insert it, and the loser dies on a UNIQUE-constraint error; two can
also both find no table and the second CREATE TABLE fails. The channel below treats
"someone else created it first" as success and looks again, so any number of processes may
start in any order. `broker_prepare` additionally declares the task queues once before a
stack starts its processes, so the common case never even reaches the race.

Redis (REDIS_URL) has no such tables; there the same calls are cheap no-ops.
"""

from __future__ import annotations

import time

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport.sqlalchemy import Channel as SqlAlchemyChannel
from kombu.transport.sqlalchemy import Transport as SqlAlchemyTransport
from sqlalchemy.exc import IntegrityError, OperationalError

ALIAS = "ferrysqla"
# How long to back off between looks when another process holds the row or the write lock.
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


def _created_elsewhere(exc: OperationalError) -> bool:
    return "already exists" in str(exc)


class Channel(SqlAlchemyChannel):
    """kombu's SQLAlchemy channel, safe when several processes create tables and queues at once."""

    def _open(self):
        for delay in (*RETRY_DELAYS, None):
            try:
                return super()._open()
            except OperationalError as exc:
                # Another process created the tables between kombu's check and its CREATE.
                if delay is None or not _created_elsewhere(exc):
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _get_or_create(self, queue: str):
        for delay in (*RETRY_DELAYS, None):
            found = self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).first()
            if found is not None:
                return found
            created = self.queue_cls(queue)
            self.session.add(created)
            try:
                self.session.commit()
                return created
            except (IntegrityError, OperationalError):
                # Another process inserted the same queue (UNIQUE) or held SQLite's write lock:
                # forget our row and look again rather than return one that was never stored.
                self.session.rollback()
                if delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")


class Transport(SqlAlchemyTransport):
    Channel = Channel


def register_transport() -> None:
    """Make `ferrysqla+sqlite:///...` broker URLs resolve to the transport above."""
    TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")


def broker_prepare(app: Celery) -> None:
    """Create the broker's tables and declare every task queue once, before processes start."""
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=3)
        channel = connection.default_channel
        for queue in app.amqp.queues.values():
            queue(channel).declare()
