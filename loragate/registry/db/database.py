"""The one database object every repository shares: the engine, a reader for one-statement
reads, the write transaction, psycopg pipelining, the retry policy for a lost
compare-and-set, dialect-specific statements, and the audit writer.

Every write is one transaction. On SQLite ``BEGIN IMMEDIATE`` takes the write lock up
front; on Postgres row locks and compare-and-set in the WHERE clause decide races. Rows
are turned into records before the connection is released.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import create_engine, event, insert
from sqlalchemy.engine import URL, Connection, Engine, ExceptionContext
from sqlalchemy.exc import OperationalError

from loragate.registry.db import migrate
from loragate.registry.db.schema import audit_events
from loragate.registry.errors import ErrorCode, InvalidInput, PermissionDenied, Unavailable
from loragate.registry.records.adapters import utcnow
from loragate.registry.retrying import tolerating_concurrent_updates, until_deadline

T = TypeVar("T")
# SQLSTATE of a statement the connected database role holds no grant for
INSUFFICIENT_PRIVILEGE = "42501"
# SQLSTATEs of a session limit reached: a lock waited for too long, a statement ran too long
LOCK_NOT_AVAILABLE = "55P03"
QUERY_CANCELED = "57014"
# ... and a transaction left idle too long: the server ended the session
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"


@dataclass(frozen=True)
class SessionLimits:
    """Bounds on every registry session (Postgres): connecting, waiting for a lock (an
    adapter's row held by a stuck move), one statement, and a transaction left idle (a
    process that stopped while holding a lock). Seconds; 0 means no limit."""

    connect_timeout_s: int = 10
    lock_timeout_s: float = 60.0
    statement_timeout_s: float = 120.0
    idle_in_transaction_timeout_s: float = 300.0

    def options(self) -> str:
        """libpq ``options``: the limits as the session's own settings, in milliseconds."""
        limits = {
            "lock_timeout": self.lock_timeout_s,
            "statement_timeout": self.statement_timeout_s,
            "idle_in_transaction_session_timeout": self.idle_in_transaction_timeout_s,
        }
        return " ".join(f"-c {name}={round(seconds * 1000)}" for name, seconds in limits.items())


DEFAULT_LIMITS = SessionLimits()
# no RETURNING of the new id: nothing reads it
_INSERT_AUDIT = insert(audit_events).inline()


def utc(value: datetime) -> datetime:
    """SQLite hands datetimes back naive: they were written in UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else utc(value)


def make_engine(url: URL, limits: SessionLimits = DEFAULT_LIMITS) -> Engine:
    """An engine whose connection failures are ``Unavailable`` (database_unavailable) and
    whose sessions reaching a limit are ``Unavailable`` (database_busy)."""
    if url.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    else:
        connect_args = {"connect_timeout": limits.connect_timeout_s, "options": limits.options()}
        engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        _connect_within(engine, limits.connect_timeout_s)
    shown = url.render_as_string(hide_password=True)

    @event.listens_for(engine, "handle_error")
    def _unreachable(context: ExceptionContext) -> None:
        sqlstate = getattr(context.original_exception, "sqlstate", None)
        if sqlstate == INSUFFICIENT_PRIVILEGE:
            first_line = str(context.original_exception).strip().splitlines()[0][:200]
            raise PermissionDenied(
                f"the database user of {shown} may not do this: {first_line}", field="LORAGATE_DATABASE_URL"
            ) from context.original_exception
        if sqlstate in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
            what, setting, seconds = (
                ("waited for a lock", "LORAGATE_DATABASE_LOCK_TIMEOUT_S", limits.lock_timeout_s)
                if sqlstate == LOCK_NOT_AVAILABLE
                else ("ran", "LORAGATE_DATABASE_STATEMENT_TIMEOUT_S", limits.statement_timeout_s)
            )
            raise Unavailable(
                f"database {shown} is busy: a statement {what} longer than {seconds:g} s ({setting}); "
                "another operation holds what it needs -- try again",
                code=ErrorCode.DATABASE_BUSY,
                field=setting,
            ) from context.original_exception
        if sqlstate == IDLE_IN_TRANSACTION_TIMEOUT:
            raise Unavailable(
                f"database {shown} ended the session: its transaction was idle longer than "
                f"{limits.idle_in_transaction_timeout_s:g} s (LORAGATE_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S); "
                "nothing it wrote was kept",
                code=ErrorCode.DATABASE_UNAVAILABLE,
                field="LORAGATE_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S",
            ) from context.original_exception
        # no connection could be made, or the one in use died: the database, not the request
        if isinstance(context.sqlalchemy_exception, OperationalError) and (
            context.connection is None or context.is_disconnect
        ):
            first_line = str(context.original_exception).strip().splitlines()[0][:200]
            raise Unavailable(
                f"database {shown} unreachable: {first_line}",
                code=ErrorCode.DATABASE_UNAVAILABLE,
                field="LORAGATE_DATABASE_URL",
            ) from context.original_exception

    return engine


def _connect_within(engine: Engine, deadline_s: int) -> None:
    """A new Postgres connection is tried again until ``deadline_s`` has passed in all.

    A full server ("too many clients"), one starting up or failing over refuses the
    connection for a moment; 64 CLI calls at once must queue for a slot, not fail. libpq
    reports those refusals without a SQLSTATE, so every failed connect is retried, each
    attempt limited to what is left of the deadline: a database that is down still fails
    after ``deadline_s``, as one line.
    """
    operational_error = engine.dialect.loaded_dbapi.OperationalError

    @event.listens_for(engine, "do_connect")
    def _patiently(dialect, _record, cargs, cparams):
        ends_at = time.monotonic() + deadline_s

        def attempt():
            # libpq's own timeout counts per attempt, and it rounds anything under 2 s up to 2
            left = max(2, math.ceil(ends_at - time.monotonic()))
            return dialect.connect(*cargs, **{**cparams, "connect_timeout": left})

        retrying = until_deadline(deadline_s, step_s=0.05, retry_if=lambda e: isinstance(e, operational_error))
        return retrying(attempt)


class Database:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name
        self.is_sqlite = self.dialect == "sqlite"
        # One-statement reads need no transaction: on Postgres that saves the BEGIN and
        # ROLLBACK round trips around every resolve (same pool, other isolation level).
        self.reader = engine if self.is_sqlite else engine.execution_options(isolation_level="AUTOCOMMIT")

    def close(self) -> None:
        self.engine.dispose()

    # -- schema ---------------------------------------------------------------

    def upgrade_schema(self) -> None:
        migrate.upgrade(self.engine)

    def check_schema(self) -> None:
        """Raises:
        InvalidInput: NOT_INITIALIZED when the schema is missing or not at ``migrate.HEAD``.
        Unavailable: DATABASE_UNAVAILABLE when the database cannot be reached.
        """
        current = migrate.current_revision(self.engine)
        if current != migrate.HEAD:
            raise InvalidInput(
                f"registry schema is at {current or 'nothing'}, code expects {migrate.HEAD}: run `loragate init`",
                code=ErrorCode.NOT_INITIALIZED,
                field="LORAGATE_DATABASE_URL",
            )

    # -- transactions ---------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction, committed when the block ends and rolled back on error."""
        with self.engine.begin() as conn:
            if self.is_sqlite:
                # take the write lock up front: two deferred writers would deadlock
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            yield conn

    @contextmanager
    def pipelined(self, conn: Connection) -> Iterator[None]:
        """Postgres: send the statements inside in one round trip (psycopg pipeline mode)."""
        if self.is_sqlite:
            yield
            return
        driver = conn.connection.driver_connection
        assert driver is not None, "a checked-out connection has its driver connection"
        with driver.pipeline():
            yield
        # Postgres arms idle_in_transaction_session_timeout only once a statement outside
        # pipeline mode has run: without this, a move stalled on a replica after its pipelined
        # writes would hold the adapter's row past the limit (seen: never terminated)
        driver.execute("SELECT 1")

    def retrying(self, fn: Callable[[], T]) -> T:
        """``fn()`` again after a lost compare-and-set (``ConcurrentUpdate``), a few times."""
        return tolerating_concurrent_updates()(fn)

    def insert_statement(self) -> Any:
        """INSERT with ON CONFLICT, which both dialects spell alike."""
        from sqlalchemy.dialects import postgresql, sqlite

        return sqlite.insert if self.is_sqlite else postgresql.insert

    # -- the audit log ----------------------------------------------------------

    def audit(
        self,
        conn: Connection,
        *,
        actor: str,
        action: str,
        adapter_name: str | None,
        version_id: str | None = None,
        stage: str | None = None,
        from_value: str | None = None,
        to_value: str | None = None,
        reason: str | None = None,
        details: dict | None = None,
        at: datetime | None = None,
    ) -> None:
        """Append one event inside the caller's transaction: it commits with the change."""
        conn.execute(
            _INSERT_AUDIT,
            {
                "at": at or utcnow(),
                "actor": actor,
                "action": action,
                "adapter_name": adapter_name,
                "version_id": version_id,
                "stage": stage,
                "from_value": from_value,
                "to_value": to_value,
                "reason": reason,
                "details": details or {},
            },
        )
