"""SQL store of the registry (SQLAlchemy 2 Core) for Postgres (psycopg 3) and SQLite.

Every write is one transaction. A pointer move first claims the adapter's row with an
UPDATE that bumps its ``revision`` (the row lock on Postgres; ``BEGIN IMMEDIATE`` holds the
write lock on SQLite), plans from what it reads under that lock, and changes each version's
stage only if it is still the stage it planned from, so concurrent moves serialise and none
is lost. Rows are turned into domain objects before the connection is released.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import String, and_, bindparam, case, create_engine, delete, event, func, insert, or_, select, update
from sqlalchemy.engine import URL, Connection, Engine, ExceptionContext
from sqlalchemy.exc import IntegrityError, OperationalError

from registry.db import migrate
from registry.db.schema import (
    adapter_versions,
    adapters,
    api_tokens,
    audit_events,
    base_models,
    canary_observations,
    canary_windows,
    golden_sets,
    replicas,
    signing_keys,
    stage_pointers,
    validation_runs,
    version_signatures,
)
from registry.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    ErrorCode,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from registry.intake.catalog import BaseModelRecord
from registry.records.adapters import Adapter, AdapterVersion, AuditEvent, GoldenSetRef, ValidationRun, utcnow
from registry.records.reports import ValidationReport
from registry.rules.access import IssuedToken, Role, SigningKey, TokenRecord, VersionSignature
from registry.rules.canary import (
    ACTIVE,
    WINDOW_MOVES,
    CanaryThresholds,
    CanaryWindow,
    Monitor,
    Observation,
    SideStats,
    Verdict,
    WindowStatus,
)
from registry.rules.fleet import AdapterPointers, Replica, ReplicaRole
from registry.rules.lifecycle import Plan, Pointer, Stage, ValidationStatus, VersionState
from registry.rules.names import AdapterName

MAX_ATTEMPTS = 8
# SQLSTATE of a statement the connected database role holds no grant for
INSUFFICIENT_PRIVILEGE = "42501"
# a version id names the second it was made: ``YYYYMMDD_HHMMSS_<weights hex12>``
VERSION_ID_FORMAT = "%Y%m%d_%H%M%S"
# how far past "now" a version id may be moved to avoid a collision
VERSION_ID_SPREAD = timedelta(hours=1)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def make_engine(url: URL, connect_timeout_s: int = 10) -> Engine:
    """An engine whose connection failures are ``Unavailable`` (database_unavailable)."""
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
        engine = create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": connect_timeout_s})
    shown = url.render_as_string(hide_password=True)

    @event.listens_for(engine, "handle_error")
    def _unreachable(context: ExceptionContext) -> None:
        if getattr(context.original_exception, "sqlstate", None) == INSUFFICIENT_PRIVILEGE:
            first_line = str(context.original_exception).strip().splitlines()[0][:200]
            raise PermissionDenied(
                f"the database user of {shown} may not do this: {first_line}", field="LORAGATE_DATABASE_URL"
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


def _version_from_row(row, name: str | None = None) -> AdapterVersion:
    m = row._mapping
    return AdapterVersion(
        version_id=m["version_id"],
        name=name if name is not None else m["name"],
        content_address=m["content_address"],
        identity_sha256=m["identity_sha256"],
        manifest_sha256=m["manifest_sha256"],
        weights_sha256=m["weights_sha256"],
        weights_size=m["weights_size"],
        adapter_config_sha256=m["adapter_config_sha256"],
        base_model_id=m["base_model_id"],
        base_model_commit=m["base_model_commit"],
        lora_rank=m["lora_rank"],
        stage=Stage(m["stage"]),
        validation_status=ValidationStatus(m["validation_status"]),
        previous_version=m["previous_version"],
        manifest=m["manifest"],
        created_at=_utc(m["created_at"]),
        created_by=m["created_by"],
    )


def _run_from_row(row) -> ValidationRun:
    return ValidationRun(
        id=row.id,
        version_id=row.version_id,
        status=ValidationStatus(row.status),
        golden_set_digest=row.golden_set_digest,
        output_sha256=row.output_sha256,
        report=ValidationReport.from_json(row.report),
        started_at=_utc(row.started_at),
        finished_at=_utc(row.finished_at),
        actor=row.actor,
    )


class _NothingToDo(Exception):
    """Raised out of a write transaction to roll it back and return the (empty) plan."""


def _replica_from_row(row) -> Replica:
    m = row._mapping
    return Replica(
        url=m["url"],
        base_model_id=m["base_model_id"],
        base_model_commit=m["base_model_commit"],
        role=ReplicaRole(m["role"]),
        adapter_dir=m["adapter_dir"],
        max_lora_rank=m["max_lora_rank"],
        max_loras=m["max_loras"],
        served_model_name=m["served_model_name"],
        created_at=_utc(m["created_at"]),
        created_by=m["created_by"],
    )


def _base_from_row(row) -> BaseModelRecord:
    m = dict(row._mapping)
    m["created_at"] = _utc(m["created_at"])
    return BaseModelRecord(**m)


# Statements on the pointer-move path are built once: constructing them per call costs
# more than their round trips.
_INSERT_AUDIT = insert(audit_events).inline()  # no RETURNING of the new id: nothing reads it
_CLAIM = update(adapters).values(revision=adapters.c.revision + 1).returning(adapters.c.id, adapters.c.name)
_CLAIM_BY_NAME = _CLAIM.where(adapters.c.name == bindparam("adapter_name"))
_CLAIM_BY_VERSION = _CLAIM.where(
    adapters.c.id
    == select(adapter_versions.c.adapter_id)
    .where(adapter_versions.c.version_id == bindparam("version_id"))
    .scalar_subquery()
)
# Driven from the (at most four) wanted ids, so every lookup is by primary key whatever
# the number of versions: an OR of IN-subquery and equality makes Postgres scan the table.
_WANTED = (
    select(stage_pointers.c.version_id.label("version_id"))
    .where(stage_pointers.c.adapter_id == bindparam("adapter_id"))
    .union(select(bindparam("subject", type_=String(64)).label("version_id")))
    .subquery("wanted")
)
_POINTERS_AND_STATES = select(
    adapter_versions.c.version_id,
    adapter_versions.c.stage,
    adapter_versions.c.validation_status,
    stage_pointers.c.stage.label("pointer"),
    adapter_versions.c.weights_sha256,
    adapter_versions.c.adapter_config_sha256,
    adapter_versions.c.manifest_sha256,
).select_from(
    _WANTED.join(adapter_versions, adapter_versions.c.version_id == _WANTED.c.version_id).outerjoin(
        stage_pointers,
        and_(
            stage_pointers.c.version_id == adapter_versions.c.version_id,
            stage_pointers.c.adapter_id == bindparam("adapter_id"),
        ),
    )
)


@lru_cache(maxsize=8)
def _stage_update(count: int):
    """One UPDATE moving ``count`` versions from their planned stage to the next, each only if
    it is still at the stage the plan read (compare-and-set). Built once per count: a move
    makes one or two, and building the statement costs more than its round trip."""
    version, stage = adapter_versions.c.version_id, adapter_versions.c.stage
    return (
        update(adapter_versions)
        .where(or_(*[and_(version == bindparam(f"v{i}"), stage == bindparam(f"from{i}")) for i in range(count)]))
        .values(stage=case(*[(version == bindparam(f"v{i}"), bindparam(f"to{i}")) for i in range(count)]))
    )


_DELETE_POINTER = delete(stage_pointers).where(
    stage_pointers.c.adapter_id == bindparam("adapter_id"), stage_pointers.c.stage == bindparam("pointer")
)


def _dialect_insert(dialect: str) -> Any:
    """INSERT with ON CONFLICT, which both dialects spell alike."""
    from sqlalchemy.dialects import postgresql, sqlite

    return sqlite.insert if dialect == "sqlite" else postgresql.insert


def _insert_adapter_if_missing_statement(dialect: str):
    return (
        _dialect_insert(dialect)(adapters)
        .values(
            name=bindparam("name"),
            namespace=bindparam("namespace"),
            base=bindparam("base"),
            task=bindparam("task"),
            revision=0,
            created_at=bindparam("now"),
        )
        .on_conflict_do_nothing(index_elements=["name"])
    )


def _upsert_pointer_statement(dialect: str):
    stmt = _dialect_insert(dialect)(stage_pointers).values(
        adapter_id=bindparam("adapter_id"),
        stage=bindparam("pointer"),
        version_id=bindparam("version_id"),
        moved_at=bindparam("now"),
    )
    return stmt.on_conflict_do_update(
        index_elements=["adapter_id", "stage"],
        set_={"version_id": stmt.excluded.version_id, "moved_at": stmt.excluded.moved_at},
    )


_VERSION_COLUMNS = [*adapter_versions.c, adapters.c.name]
_VERSIONS_WITH_NAME = select(*_VERSION_COLUMNS).select_from(
    adapter_versions.join(adapters, adapters.c.id == adapter_versions.c.adapter_id)
)


class SqlStore:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        # One-statement reads need no transaction: on Postgres that saves the BEGIN and
        # ROLLBACK round trips around every resolve (same pool, other isolation level).
        self.reader = engine if self.is_sqlite else engine.execution_options(isolation_level="AUTOCOMMIT")
        self._upsert_pointer = _upsert_pointer_statement(engine.dialect.name)
        self._insert_adapter_if_missing = _insert_adapter_if_missing_statement(engine.dialect.name)
        # the pointer's foreign key guarantees the version exists: no join needed
        self._resolve = (
            select(stage_pointers.c.version_id)
            .select_from(adapters.join(stage_pointers, stage_pointers.c.adapter_id == adapters.c.id))
            .where(adapters.c.name == bindparam("name"), stage_pointers.c.stage == bindparam("stage"))
        )

    @classmethod
    def from_url(cls, url: URL, connect_timeout_s: int = 10) -> SqlStore:
        return cls(make_engine(url, connect_timeout_s))

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
        head = migrate.HEAD
        if current != head:
            raise InvalidInput(
                f"registry schema is at {current or 'nothing'}, code expects {head}: run `loragate init`",
                code=ErrorCode.NOT_INITIALIZED,
                field="LORAGATE_DATABASE_URL",
            )

    # -- transactions ---------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            if self.is_sqlite:
                # take the write lock up front: two deferred writers would deadlock
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            yield conn

    @contextmanager
    def _pipelined(self, conn: Connection) -> Iterator[None]:
        """Postgres: send the statements inside in one round trip (psycopg pipeline mode)."""
        if self.is_sqlite:
            yield
            return
        driver = conn.connection.driver_connection
        assert driver is not None, "a checked-out connection has its driver connection"
        with driver.pipeline():
            yield

    def _retrying(self, fn: Callable[[], Any]) -> Any:
        for attempt in range(MAX_ATTEMPTS):
            try:
                return fn()
            except ConcurrentUpdate:
                if attempt == MAX_ATTEMPTS - 1:
                    raise
                time.sleep(0.002 * (attempt + 1))

    def _audit(
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

    # -- base catalog ---------------------------------------------------------

    def add_base(self, record: BaseModelRecord, actor: str) -> tuple[BaseModelRecord, bool]:
        """Pin a base; the same pin again is a no-op, returning (record, created).

        Raises:
            AlreadyExists: the id and commit are pinned with other content.
        """
        # a concurrent pin of the same base makes the insert fail once; the second pass reads it
        for _ in range(2):
            existing = self.get_base(record.base_model_id, record.base_model_commit)
            if existing is not None:
                same = (existing.content_digest, existing.config_sha256) == (
                    record.content_digest,
                    record.config_sha256,
                )
                if not same:
                    raise AlreadyExists(f"base {record.label} is already pinned with other content", field="id")
                return existing, False
            now = utcnow()
            values = {k: v for k, v in record.__dict__.items() if k not in ("created_at", "created_by")}
            try:
                with self._write() as conn:
                    conn.execute(insert(base_models).values(**values, created_at=now, created_by=actor))
                    self._audit(
                        conn,
                        actor=actor,
                        action="base_add",
                        adapter_name=None,
                        to_value=record.base_model_commit[:64],
                        details={"base_model_id": record.base_model_id, "source": record.source},
                    )
            except IntegrityError:
                continue
            return BaseModelRecord(**{**values, "created_at": now, "created_by": actor}), True
        raise ConcurrentUpdate(f"base {record.label} could not be pinned or read back")

    def get_base(self, base_model_id: str, commit: str) -> BaseModelRecord | None:
        with self.reader.connect() as conn:
            row = conn.execute(
                select(base_models).where(
                    base_models.c.base_model_id == base_model_id, base_models.c.base_model_commit == commit
                )
            ).first()
        return _base_from_row(row) if row else None

    def bases(self, base_model_id: str | None = None) -> list[BaseModelRecord]:
        stmt = select(base_models).order_by(base_models.c.base_model_id, base_models.c.created_at)
        if base_model_id is not None:
            stmt = stmt.where(base_models.c.base_model_id == base_model_id)
        with self.reader.connect() as conn:
            return [_base_from_row(r) for r in conn.execute(stmt)]

    # -- versions -------------------------------------------------------------

    def find_version_by_content(self, name: str, content_address: str) -> AdapterVersion | None:
        with self.reader.connect() as conn:
            row = conn.execute(
                _VERSIONS_WITH_NAME.where(
                    adapters.c.name == name, adapter_versions.c.content_address == content_address
                )
            ).first()
        return _version_from_row(row) if row else None

    def _latest_version(self, conn: Connection, adapter_id: int):
        return conn.execute(
            select(adapter_versions.c.version_id, adapter_versions.c.created_at)
            .where(adapter_versions.c.adapter_id == adapter_id)
            .order_by(adapter_versions.c.created_at.desc(), adapter_versions.c.version_id.desc())
            .limit(1)
        ).first()

    def _lock_adapter_creating(self, conn: Connection, name: AdapterName, now: datetime) -> int:
        """The adapter's id, its row locked for this transaction; created when new.

        Concurrent first registrations of one name do not fail: the loser of the insert
        does nothing and waits on the winner's row lock.
        """
        conn.execute(
            self._insert_adapter_if_missing,
            {"name": str(name), "namespace": name.namespace, "base": name.base, "task": name.task, "now": now},
        )
        return conn.execute(select(adapters.c.id).where(adapters.c.name == str(name)).with_for_update()).scalar_one()

    def _free_version_id(self, conn: Connection, created_at: datetime, weights_hex: str) -> str:
        """The first free id from ``created_at`` on, found with one range query.

        Ids carry the second they were made; two different manifests over the same weights
        in one second take the next free second instead of colliding.
        """
        suffix = f"_{weights_hex[:12]}"
        first = f"{created_at:{VERSION_ID_FORMAT}}{suffix}"
        last = f"{created_at + VERSION_ID_SPREAD:{VERSION_ID_FORMAT}}{suffix}"
        taken = set(
            conn.execute(
                select(adapter_versions.c.version_id).where(
                    adapter_versions.c.version_id.between(first, last),
                    adapter_versions.c.version_id.endswith(suffix, autoescape=True),
                )
            ).scalars()
        )
        for offset in range(int(VERSION_ID_SPREAD.total_seconds()) + 1):
            candidate = f"{created_at + timedelta(seconds=offset):{VERSION_ID_FORMAT}}{suffix}"
            if candidate not in taken:
                return candidate
        raise ConcurrentUpdate(f"no free version id within {VERSION_ID_SPREAD} of {first}")

    def insert_version(
        self,
        name: AdapterName,
        content_address: str,
        weights_hex: str,
        finalize: Callable[[str | None, str, datetime], dict[str, Any]],
        *,
        actor: str,
    ) -> tuple[AdapterVersion, bool]:
        """Add a version of ``name`` after its newest one; returns (version, created).

        Under the adapter's row lock: the same content registered meanwhile is returned
        (created False); otherwise the previous version, the creation time (after the
        previous one's) and a free version id are chosen, and ``finalize(previous,
        version_id, created_at)`` gives the row's values (it stores the final manifest).
        Concurrent registers of one adapter wait their turn, so ``previous_version``
        forms one linear chain.

        Raises:
            ConcurrentUpdate: the row could not be inserted after retries (version ids
                colliding with other adapters' registers in the same second).
        """
        for _ in range(MAX_ATTEMPTS):
            try:
                with self._write() as conn:
                    now = utcnow()
                    adapter_id = self._lock_adapter_creating(conn, name, now)
                    row = conn.execute(
                        _VERSIONS_WITH_NAME.where(
                            adapter_versions.c.adapter_id == adapter_id,
                            adapter_versions.c.content_address == content_address,
                        )
                    ).first()
                    if row is not None:
                        return _version_from_row(row), False
                    latest = self._latest_version(conn, adapter_id)
                    previous = latest.version_id if latest else None
                    created_at = max(now, _utc(latest.created_at) + timedelta(microseconds=1)) if latest else now
                    version_id = self._free_version_id(conn, created_at, weights_hex)
                    values = finalize(previous, version_id, created_at)
                    row = conn.execute(
                        insert(adapter_versions)
                        .values(
                            **values,
                            version_id=version_id,
                            adapter_id=adapter_id,
                            previous_version=previous,
                            created_at=created_at,
                            created_by=actor,
                        )
                        .returning(*adapter_versions.c)
                    ).first()
                    self._audit(
                        conn,
                        actor=actor,
                        action="register",
                        adapter_name=str(name),
                        version_id=version_id,
                        to_value=Stage.STAGING.value,
                        at=created_at,
                        details={"content_address": content_address, "weights_sha256": weights_hex},
                    )
                    return _version_from_row(row, name=str(name)), True
            except IntegrityError:
                # a version id taken by another adapter's register in the same instant
                continue
        raise ConcurrentUpdate(f"could not register a version of {name}: its row kept colliding")

    def get_version(self, version_id: str) -> AdapterVersion:
        """Raises:
        NotFound: no such version.
        """
        with self.reader.connect() as conn:
            row = conn.execute(_VERSIONS_WITH_NAME.where(adapter_versions.c.version_id == version_id)).first()
        if row is None:
            raise NotFound(f"no adapter version {version_id!r}", field="version")
        return _version_from_row(row)

    def list_versions(self, name: str | None = None) -> list[AdapterVersion]:
        stmt = _VERSIONS_WITH_NAME.order_by(
            adapters.c.name, adapter_versions.c.created_at, adapter_versions.c.version_id
        )
        if name is not None:
            stmt = stmt.where(adapters.c.name == name)
        with self.reader.connect() as conn:
            return [_version_from_row(r) for r in conn.execute(stmt)]

    # -- adapters and pointers ------------------------------------------------

    def get_adapter(self, name: str) -> Adapter:
        """Raises:
        NotFound: no such adapter.
        """
        with self.reader.connect() as conn:
            row = conn.execute(select(adapters).where(adapters.c.name == name)).first()
            if row is None:
                raise NotFound(f"no adapter named {name!r}", field="name")
            pointers = self._pointers(conn, row.id)
            count = conn.execute(select(func.count()).where(adapter_versions.c.adapter_id == row.id)).scalar_one()
        return Adapter(
            name=row.name,
            canary=pointers.get(Pointer.CANARY),
            production=pointers.get(Pointer.PRODUCTION),
            previous=pointers.get(Pointer.PREVIOUS),
            revision=row.revision,
            version_count=count,
            created_at=_utc(row.created_at),
        )

    def resolve(self, name: str, stage: str) -> str | None:
        """The version a stage pointer names: one indexed join, the hot path of serving."""
        with self.reader.connect() as conn:
            return conn.execute(self._resolve, {"name": name, "stage": stage}).scalar()

    def deployed_at(self, name: str, stage: str) -> datetime | None:
        with self.reader.connect() as conn:
            moved_at = conn.execute(
                select(stage_pointers.c.moved_at)
                .select_from(stage_pointers.join(adapters, adapters.c.id == stage_pointers.c.adapter_id))
                .where(adapters.c.name == name, stage_pointers.c.stage == stage)
            ).scalar()
        return _utc(moved_at) if moved_at is not None else None

    def _pointers(self, conn: Connection, adapter_id: int) -> dict[Pointer, str]:
        rows = conn.execute(
            select(stage_pointers.c.stage, stage_pointers.c.version_id).where(stage_pointers.c.adapter_id == adapter_id)
        )
        return {Pointer(r.stage): r.version_id for r in rows}

    def _claim(self, conn: Connection, name: str | None, version_id: str | None):
        """Lock the adapter row by bumping its revision; returns (id, name) or None.

        An UPDATE takes the same row lock as SELECT ... FOR UPDATE and does the revision
        bump in the same round trip; an operation that turns out to change nothing
        rolls the bump back.
        """
        if name is not None:
            return conn.execute(_CLAIM_BY_NAME, {"adapter_name": name}).first()
        return conn.execute(_CLAIM_BY_VERSION, {"version_id": version_id}).first()

    def _pointers_and_states(self, conn: Connection, adapter_id: int, subject: str | None):
        """The adapter's pointers, the states of every version they or ``subject`` name, and
        those versions' blob digests (weights, adapter config, manifest)."""
        pointers: dict[Pointer, str] = {}
        states: dict[str, VersionState] = {}
        blobs: dict[str, tuple[str, str, str]] = {}
        for r in conn.execute(_POINTERS_AND_STATES, {"adapter_id": adapter_id, "subject": subject}):
            states[r.version_id] = VersionState(r.version_id, Stage(r.stage), ValidationStatus(r.validation_status))
            blobs[r.version_id] = (r.weights_sha256, r.adapter_config_sha256, r.manifest_sha256)
            if r.pointer is not None:
                pointers[Pointer(r.pointer)] = r.version_id
        return pointers, states, blobs

    def apply_plan(
        self,
        planner: Callable[[dict[Pointer, str], dict[str, VersionState]], Plan],
        *,
        name: str | None = None,
        subject: str | None = None,
        actor: str,
        reason: str | None,
        details: dict | None = None,
        before_commit: Callable[[Connection], None] | None = None,
        verify_target: Callable[[Pointer, str, tuple[str, str, str]], None] | None = None,
        on_planned: Callable[[Plan], None] | None = None,
        authorize: Callable[[str], None] | None = None,
    ) -> Plan:
        """Plan under the adapter's row lock and apply atomically; retried on a lost race.

        ``authorize`` gets the adapter's name as soon as its row is claimed (the name of a
        version costs no extra round trip there) and raises to refuse.

        The adapter is named by ``name`` or found from the ``subject`` version. Every version
        the plan points a pointer at is passed to ``verify_target`` with the pointer and its blob digests
        (read in the same query as the states) before anything is written; then a plan that
        moves a pointer goes to ``on_planned`` (the fleet switch), still under the lock: if it
        raises, nothing is written.
        """

        def attempt() -> Plan:
            with self._write() as conn:
                row = self._claim(conn, name, subject)
                if row is None:
                    raise (
                        NotFound(f"no adapter named {name!r}", field="name")
                        if name
                        else NotFound(f"no adapter version {subject!r}", field="version")
                    )
                if authorize is not None:
                    authorize(row.name)  # a denial rolls the claim back: nothing changed
                pointers, states, blobs = self._pointers_and_states(conn, row.id, subject)
                if subject is not None and subject not in states:
                    raise NotFound(f"no adapter version {subject!r}", field="version")
                plan = planner(pointers, states)
                if verify_target is not None:
                    for pointer, target in plan.pointer_changes.items():
                        if target is not None:
                            verify_target(pointer, target, blobs[target])
                if on_planned is not None and plan.pointer_changes:
                    on_planned(plan)
                if plan.empty and plan.action != "validate":
                    raise _NothingToDo(plan)  # roll back the revision bump
                now = utcnow()
                if plan.stage_changes:
                    params: dict[str, str] = {}
                    for i, (moved, before, after) in enumerate(plan.stage_changes):
                        params |= {f"v{i}": moved, f"from{i}": before.value, f"to{i}": after.value}
                    changed = conn.execute(_stage_update(len(plan.stage_changes)), params).rowcount
                    if changed != len(plan.stage_changes):
                        raise ConcurrentUpdate(f"a version of {row.name} changed stage meanwhile")
                # nothing below returns anything we read: one round trip for all of it
                with self._pipelined(conn):
                    for pointer, version_id in plan.pointer_changes.items():
                        if version_id is None:
                            conn.execute(_DELETE_POINTER, {"adapter_id": row.id, "pointer": pointer.value})
                        else:
                            conn.execute(
                                self._upsert_pointer,
                                {"adapter_id": row.id, "pointer": pointer.value, "version_id": version_id, "now": now},
                            )
                    self._audit(
                        conn,
                        actor=actor,
                        action=plan.action,
                        adapter_name=row.name,
                        version_id=plan.subject,
                        stage=plan.audit_stage.value if plan.audit_stage else None,
                        from_value=plan.audit_from,
                        to_value=plan.audit_to,
                        reason=reason,
                        at=now,
                        details={
                            **(details or {}),
                            "stage_changes": [[v, a.value, b.value] for v, a, b in plan.stage_changes],
                        },
                    )
                if before_commit is not None:
                    before_commit(conn)
                return plan

        try:
            return self._retrying(attempt)
        except _NothingToDo as done:
            return done.args[0]

    # -- the fleet --------------------------------------------------------------

    def add_replica(self, replica: Replica, actor: str) -> tuple[Replica, bool]:
        """Add a replica to the fleet; the same replica again is a no-op, returning (replica, created).

        Raises:
            AlreadyExists: the URL is in the fleet with another configuration.
        """
        existing = self.replica(replica.url)
        if existing is not None:
            if dataclasses.replace(existing, created_at=None, created_by=None) != replica:
                raise AlreadyExists(f"replica {replica.url} is in the fleet with another configuration", field="url")
            return existing, False
        now = utcnow()
        values = {**replica.as_dict(), "created_at": now, "created_by": actor}
        try:
            with self._write() as conn:
                conn.execute(insert(replicas).values(**values))
                self._audit(
                    conn,
                    actor=actor,
                    action="fleet_add",
                    adapter_name=None,
                    to_value=replica.url[:64],
                    details=replica.as_dict(),
                )
        except IntegrityError as e:
            raise AlreadyExists(f"replica {replica.url} was added meanwhile", field="url") from e
        return dataclasses.replace(replica, created_at=now, created_by=actor), True

    def remove_replica(self, url: str, actor: str) -> Replica:
        """Raises:
        NotFound: no replica with that URL.
        """
        with self._write() as conn:
            row = conn.execute(select(replicas).where(replicas.c.url == url)).first()
            if row is None:
                raise NotFound(f"no replica {url} in the fleet", field="url")
            conn.execute(delete(replicas).where(replicas.c.url == url))
            self._audit(conn, actor=actor, action="fleet_remove", adapter_name=None, from_value=url[:64])
        return _replica_from_row(row)

    def replica(self, url: str) -> Replica | None:
        with self.reader.connect() as conn:
            row = conn.execute(select(replicas).where(replicas.c.url == url)).first()
        return _replica_from_row(row) if row else None

    def replicas(self, base_model_id: str | None = None) -> list[Replica]:
        stmt = select(replicas).order_by(replicas.c.base_model_id, replicas.c.role, replicas.c.url)
        if base_model_id is not None:
            stmt = stmt.where(replicas.c.base_model_id == base_model_id)
        with self.reader.connect() as conn:
            return [_replica_from_row(r) for r in conn.execute(stmt)]

    def adapter_pointers(self, base_model_id: str | None = None) -> list[AdapterPointers]:
        """Every adapter's canary and production pointer (of one base, or all)."""
        stmt = select(
            adapters.c.name, adapters.c.base, stage_pointers.c.stage, stage_pointers.c.version_id
        ).select_from(adapters.outerjoin(stage_pointers, stage_pointers.c.adapter_id == adapters.c.id))
        if base_model_id is not None:
            stmt = stmt.where(adapters.c.base == base_model_id)
        found: dict[str, dict[str, str]] = {}
        bases: dict[str, str] = {}
        with self.reader.connect() as conn:
            for r in conn.execute(stmt):
                bases[r.name] = r.base
                pointers = found.setdefault(r.name, {})
                if r.stage is not None:
                    pointers[r.stage] = r.version_id
        return [
            AdapterPointers(name, bases[name], p.get(Pointer.CANARY.value), p.get(Pointer.PRODUCTION.value))
            for name, p in sorted(found.items())
        ]

    def record_fleet_actions(self, actor: str, action: str, entries: list[dict[str, Any]], reason: str | None) -> None:
        """One audit event per fleet action (a switch, a load, an unload on one replica)."""
        if not entries:
            return
        with self._write() as conn:
            self.audit_fleet_actions(conn, actor, action, entries, reason)

    def audit_fleet_actions(
        self, conn: Connection, actor: str, action: str, entries: list[dict[str, Any]], reason: str | None
    ) -> None:
        """``record_fleet_actions`` inside a transaction already open (a pointer move's)."""
        if entries:
            for entry in entries:
                self._audit(
                    conn,
                    actor=actor,
                    action=action,
                    adapter_name=entry.get("name"),
                    version_id=entry.get("version_id"),
                    from_value=(entry.get("from") or None) and str(entry["from"])[-64:],
                    to_value=(entry.get("to") or None) and str(entry["to"])[-64:],
                    reason=reason,
                    details=entry,
                )

    def referenced_digests(self) -> set[str]:
        """Every blob a version or a golden set refers to, as ``sha256:<hex>``."""
        with self.reader.connect() as conn:
            referenced = {
                f"sha256:{h}"
                for row in conn.execute(
                    select(
                        adapter_versions.c.weights_sha256,
                        adapter_versions.c.adapter_config_sha256,
                        adapter_versions.c.manifest_sha256,
                    )
                )
                for h in row
            }
            referenced.update(conn.execute(select(golden_sets.c.digest)).scalars())
        return referenced

    def record_gc(self, actor: str, details: dict[str, Any]) -> None:
        with self._write() as conn:
            self._audit(conn, actor=actor, action="gc", adapter_name=None, details=details)

    # -- tokens, keys, signatures ---------------------------------------------

    def create_token(
        self, issued: IssuedToken, role: Role, namespace: str | None, holder: str, actor: str
    ) -> TokenRecord:
        now = utcnow()
        with self._write() as conn:
            conn.execute(
                insert(api_tokens).values(
                    token_id=issued.token_id,
                    secret_sha256=issued.secret_hash,
                    role=role.value,
                    namespace=namespace,
                    holder=holder,
                    created_at=now,
                    created_by=actor,
                )
            )
            self._audit(
                conn,
                actor=actor,
                action="token_created",
                adapter_name=None,
                to_value=issued.token_id,
                details={"role": role.value, "namespace": namespace, "holder": holder},
                at=now,
            )
        return TokenRecord(
            token_id=issued.token_id, namespace=namespace, role=role, holder=holder, created_at=now, created_by=actor
        )

    def token(self, token_id: str) -> tuple[TokenRecord, str] | None:
        """The token's record and the SHA-256 of its secret."""
        with self.reader.connect() as conn:
            row = conn.execute(select(api_tokens).where(api_tokens.c.token_id == token_id)).first()
        return None if row is None else (_token_from_row(row), row.secret_sha256)

    def tokens(self) -> list[TokenRecord]:
        with self.reader.connect() as conn:
            rows = conn.execute(select(api_tokens).order_by(api_tokens.c.created_at, api_tokens.c.token_id))
            return [_token_from_row(r) for r in rows]

    def _revoke(self, key_column: Any, value: str, actor: str, action: str) -> None:
        """Mark a token or a key revoked, once (revoking again changes nothing)."""
        table = key_column.table
        now = utcnow()
        with self._write() as conn:
            changed = conn.execute(
                update(table)
                .where(key_column == value, table.c.revoked_at.is_(None))
                .values(revoked_at=now, revoked_by=actor)
            ).rowcount
            if changed:
                self._audit(
                    conn,
                    actor=actor,
                    action=action,
                    adapter_name=None,
                    to_value=value[:64],
                    details={"id": value},
                    at=now,
                )

    def revoke_token(self, token_id: str, actor: str) -> TokenRecord:
        """Raises:
        NotFound: no such token.
        """
        self._revoke(api_tokens.c.token_id, token_id, actor, "token_revoked")
        found = self.token(token_id)
        if found is None:
            raise NotFound(f"no token {token_id!r}", field="token_id")
        return found[0]

    def add_signing_key(self, key: SigningKey, actor: str) -> tuple[SigningKey, bool]:
        """Register a public key for a role; the same key again is a no-op.

        Raises:
            AlreadyExists: the key is registered for another role or holder.
        """
        existing = self.signing_key(key.key_id)
        if existing is not None:
            if (existing.role, existing.holder) != (key.role, key.holder):
                raise AlreadyExists(
                    f"key {key.key_id} is registered to {existing.holder} for {existing.role.value}", field="public_key"
                )
            return existing, False
        now = utcnow()
        try:
            with self._write() as conn:
                conn.execute(
                    insert(signing_keys).values(
                        key_id=key.key_id,
                        role=key.role.value,
                        public_pem=key.public_pem.decode(),
                        holder=key.holder,
                        created_at=now,
                        created_by=actor,
                    )
                )
                self._audit(
                    conn,
                    actor=actor,
                    action="key_added",
                    adapter_name=None,
                    to_value=key.key_id[:64],
                    details={"key_id": key.key_id, "role": key.role.value, "holder": key.holder},
                    at=now,
                )
        except IntegrityError as e:
            raise AlreadyExists(f"key {key.key_id} was added meanwhile", field="public_key") from e
        return dataclasses.replace(key, created_at=now, created_by=actor), True

    def signing_key(self, key_id: str) -> SigningKey | None:
        with self.reader.connect() as conn:
            row = conn.execute(select(signing_keys).where(signing_keys.c.key_id == key_id)).first()
        return None if row is None else _key_from_row(row)

    def signing_keys(self) -> list[SigningKey]:
        with self.reader.connect() as conn:
            rows = conn.execute(select(signing_keys).order_by(signing_keys.c.created_at, signing_keys.c.key_id))
            return [_key_from_row(r) for r in rows]

    def revoke_signing_key(self, key_id: str, actor: str) -> SigningKey:
        """Raises:
        NotFound: no such key.
        """
        self._revoke(signing_keys.c.key_id, key_id, actor, "key_revoked")
        key = self.signing_key(key_id)
        if key is None:
            raise NotFound(f"no signing key {key_id!r}", field="key_id")
        return key

    def record_signature(
        self, version_id: str, key_id: str, run_id: int, report_sha256: str, signature: bytes, actor: str
    ) -> tuple[VersionSignature, bool]:
        """Store a signature; the same version, key and validation run again is a no-op."""
        for existing in self.signatures(version_id):
            if (existing.key_id, existing.validation_run_id) == (key_id, run_id):
                return existing, False
        version = self.get_version(version_id)
        now = utcnow()
        with self._write() as conn:
            conn.execute(
                insert(version_signatures).values(
                    version_id=version_id,
                    key_id=key_id,
                    validation_run_id=run_id,
                    report_sha256=report_sha256,
                    signature=signature.decode(),
                    signed_at=now,
                    signed_by=actor,
                )
            )
            self._audit(
                conn,
                actor=actor,
                action="signed",
                adapter_name=version.name,
                version_id=version_id,
                details={"key_id": key_id, "validation_run_id": run_id, "report_sha256": report_sha256},
                at=now,
            )
        return next(s for s in self.signatures(version_id) if (s.key_id, s.validation_run_id) == (key_id, run_id)), True

    def signatures(self, version_id: str) -> list[VersionSignature]:
        """Oldest first."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(version_signatures)
                .where(version_signatures.c.version_id == version_id)
                .order_by(version_signatures.c.id)
            )
            return [
                VersionSignature(
                    id=r.id,
                    version_id=r.version_id,
                    key_id=r.key_id,
                    validation_run_id=r.validation_run_id,
                    report_sha256=r.report_sha256,
                    signature=r.signature.encode(),
                    signed_at=_utc(r.signed_at),
                    signed_by=r.signed_by,
                )
                for r in rows
            ]

    # -- audit ----------------------------------------------------------------

    def history(self, name: str) -> list[AuditEvent]:
        self.get_adapter(name)
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(audit_events).where(audit_events.c.adapter_name == name).order_by(audit_events.c.id)
            )
            return [AuditEvent(**{**r._mapping, "at": _utc(r.at)}) for r in rows]

    def audit_count(self) -> int:
        with self.reader.connect() as conn:
            return conn.execute(select(func.count()).select_from(audit_events)).scalar_one()

    # -- golden sets ----------------------------------------------------------

    def attach_golden_set(self, name: str, digest: str, case_count: int, actor: str) -> GoldenSetRef:
        """Raises:
        NotFound: no such adapter.
        """
        now = utcnow()
        with self._write() as conn:
            adapter_id = conn.execute(select(adapters.c.id).where(adapters.c.name == name)).scalar()
            if adapter_id is None:
                raise NotFound(f"no adapter named {name!r}; register a version first", field="name")
            current = conn.execute(
                select(golden_sets).where(golden_sets.c.adapter_id == adapter_id).order_by(golden_sets.c.id.desc())
            ).first()
            if current is not None and current.digest == digest:
                # the same set again (a retried register, say): nothing to record
                return GoldenSetRef(name, digest, current.case_count, _utc(current.attached_at), current.attached_by)
            conn.execute(
                insert(golden_sets).values(
                    adapter_id=adapter_id, digest=digest, case_count=case_count, attached_at=now, attached_by=actor
                )
            )
            self._audit(
                conn,
                actor=actor,
                action="golden_set",
                adapter_name=name,
                to_value=digest[:64],
                at=now,
                details={"cases": case_count},
            )
        return GoldenSetRef(name, digest, case_count, now, actor)

    def current_golden_set(self, name: str) -> GoldenSetRef | None:
        with self.reader.connect() as conn:
            row = conn.execute(
                select(golden_sets)
                .join(adapters, adapters.c.id == golden_sets.c.adapter_id)
                .where(adapters.c.name == name)
                .order_by(golden_sets.c.id.desc())
                .limit(1)
            ).first()
        if row is None:
            return None
        return GoldenSetRef(name, row.digest, row.case_count, _utc(row.attached_at), row.attached_by)

    # -- validation runs ------------------------------------------------------

    def record_validation(
        self,
        version_id: str,
        planner: Callable[[VersionState], Plan],
        report: ValidationReport,
        *,
        started_at: datetime,
        finished_at: datetime,
        actor: str,
    ) -> ValidationRun:
        """Store a run's report and apply its lifecycle consequence in one transaction."""
        inserted: dict[str, int] = {}

        def write_run(conn: Connection) -> None:
            inserted["id"] = conn.execute(
                insert(validation_runs)
                .values(
                    version_id=version_id,
                    status=report.status.value,
                    golden_set_digest=report.golden_set_digest,
                    output_sha256=report.output_sha256,
                    report=report.to_json(),
                    started_at=started_at,
                    finished_at=finished_at,
                    actor=actor,
                )
                .returning(validation_runs.c.id)
            ).scalar_one()
            conn.execute(
                update(adapter_versions)
                .where(adapter_versions.c.version_id == version_id)
                .values(validation_status=report.status.value)
            )

        self.apply_plan(
            lambda pointers, states: planner(states[version_id]),
            subject=version_id,
            actor=actor,
            reason=report.summary,
            details={
                "status": report.status.value,
                "output_sha256": report.output_sha256,
                "golden_set": report.golden_set_digest,
            },
            before_commit=write_run,
        )
        return self.validation_run(inserted["id"])

    def validation_run(self, run_id: int) -> ValidationRun:
        with self.reader.connect() as conn:
            row = conn.execute(select(validation_runs).where(validation_runs.c.id == run_id)).first()
        return _run_from_row(row)

    def validation_runs(self, version_id: str) -> list[ValidationRun]:
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(validation_runs).where(validation_runs.c.version_id == version_id).order_by(validation_runs.c.id)
            )
            return [_run_from_row(r) for r in rows]

    def latest_passed_run_before(
        self, name: str, created_before: datetime, exclude_version: str
    ) -> ValidationRun | None:
        """The newest passed run of an older version of ``name``: the drift reference."""
        with self.reader.connect() as conn:
            run_id = conn.execute(
                select(validation_runs.c.id)
                .select_from(
                    validation_runs.join(
                        adapter_versions, adapter_versions.c.version_id == validation_runs.c.version_id
                    ).join(adapters, adapters.c.id == adapter_versions.c.adapter_id)
                )
                .where(
                    and_(
                        adapters.c.name == name,
                        validation_runs.c.status == ValidationStatus.PASSED.value,
                        adapter_versions.c.created_at <= created_before,
                        adapter_versions.c.version_id != exclude_version,
                    )
                )
                .order_by(adapter_versions.c.created_at.desc(), validation_runs.c.id.desc())
                .limit(1)
            ).scalar()
        return self.validation_run(run_id) if run_id is not None else None

    # -- the canary watch -------------------------------------------------------

    def open_canary_window(
        self, name: str, version_id: str, thresholds: CanaryThresholds, actor: str
    ) -> tuple[CanaryWindow, bool]:
        """Open a window for ``version_id``, or return its active one; returns (window, created).

        Any other active window of the adapter is superseded: one canary at a time.
        """
        now = utcnow()
        with self._write() as conn:
            active = conn.execute(
                select(canary_windows)
                .where(
                    canary_windows.c.adapter_name == name,
                    canary_windows.c.status.in_([s.value for s in ACTIVE]),
                )
                .order_by(canary_windows.c.id)
            ).all()
            mine = [r for r in active if r.version_id == version_id]
            if mine:
                return _window_from_row(mine[-1]), False
            for row in active:
                self._move_window(conn, row, WindowStatus.SUPERSEDED, f"{version_id} entered canary", actor, now)
            window_id = conn.execute(
                insert(canary_windows)
                .values(
                    adapter_name=name,
                    version_id=version_id,
                    status=WindowStatus.OPEN.value,
                    opened_at=now,
                    thresholds=thresholds.as_dict(),
                )
                .returning(canary_windows.c.id)
            ).scalar_one()
            self._audit(
                conn,
                actor=actor,
                action="canary_window",
                adapter_name=name,
                version_id=version_id,
                stage="canary",
                to_value=WindowStatus.OPEN.value,
                at=now,
                details={"window_id": window_id, "thresholds": thresholds.as_dict()},
            )
            row = conn.execute(select(canary_windows).where(canary_windows.c.id == window_id)).one()
        return _window_from_row(row), True

    def _move_window(
        self, conn: Connection, row: Any, to: WindowStatus, reason: str | None, actor: str, now: datetime
    ) -> bool:
        """Move a window's status under its current value (compare and set); False when it
        was already there. Raises IllegalTransition for a move the table forbids."""
        current = WindowStatus(row.status)
        if current == to:
            return False
        if to not in WINDOW_MOVES.get(current, frozenset()):
            raise IllegalTransition(
                f"canary window {row.id} of {row.version_id} is {current.value}, it cannot become {to.value}",
                field="status",
            )
        done = conn.execute(
            update(canary_windows)
            .where(canary_windows.c.id == row.id, canary_windows.c.status == current.value)
            .values(
                status=to.value,
                reason=reason,
                closed_at=None if to == WindowStatus.READY else now,
            )
        ).rowcount
        if done != 1:
            raise ConcurrentUpdate(f"canary window {row.id} changed meanwhile", field="status")
        self._audit(
            conn,
            actor=actor,
            action="canary_window",
            adapter_name=row.adapter_name,
            version_id=row.version_id,
            stage="canary",
            from_value=current.value,
            to_value=to.value,
            reason=reason,
            at=now,
            details={"window_id": row.id},
        )
        return True

    def move_canary_window(self, window_id: int, to: WindowStatus, reason: str | None, actor: str) -> CanaryWindow:
        """Raises:
        NotFound: no such window.
        IllegalTransition: the window's status cannot move to ``to``.
        """

        def attempt() -> CanaryWindow:
            with self._write() as conn:
                row = self._window_row(conn, window_id)
                self._move_window(conn, row, to, reason, actor, utcnow())
                return _window_from_row(self._window_row(conn, window_id))

        return self._retrying(attempt)

    def _window_row(self, conn: Connection, window_id: int) -> Any:
        row = conn.execute(select(canary_windows).where(canary_windows.c.id == window_id)).first()
        if row is None:
            raise NotFound(f"no canary window {window_id}", field="window_id")
        return row

    def canary_window(self, window_id: int) -> CanaryWindow:
        with self.reader.connect() as conn:
            return _window_from_row(self._window_row(conn, window_id))

    def canary_windows(
        self, *, statuses: tuple[WindowStatus, ...] | None = None, version_id: str | None = None
    ) -> list[CanaryWindow]:
        query = select(canary_windows).order_by(canary_windows.c.id)
        if statuses is not None:
            query = query.where(canary_windows.c.status.in_([s.value for s in statuses]))
        if version_id is not None:
            query = query.where(canary_windows.c.version_id == version_id)
        with self.reader.connect() as conn:
            return [_window_from_row(r) for r in conn.execute(query)]

    def record_canary_observation(self, observation: Observation, actor: str) -> Observation:
        """Store an observation; a ROLLBACK or READY verdict is audited with the window's move
        to READY (the rollback's own move is made by whoever withdraws the canary).

        Raises:
            NotFound: no such window.
        """
        with self._write() as conn:
            row = self._window_row(conn, observation.window_id)
            observation_id = conn.execute(
                insert(canary_observations)
                .values(
                    window_id=observation.window_id,
                    at=observation.at,
                    verdict=observation.verdict.value,
                    observation=observation.as_dict(),
                )
                .returning(canary_observations.c.id)
            ).scalar_one()
            if observation.verdict == Verdict.READY and row.status == WindowStatus.OPEN.value:
                self._move_window(conn, row, WindowStatus.READY, "; ".join(observation.reasons), actor, observation.at)
        return dataclasses.replace(observation, id=observation_id)

    def canary_observations(self, window_id: int) -> list[Observation]:
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(canary_observations.c.id, canary_observations.c.observation)
                .where(canary_observations.c.window_id == window_id)
                .order_by(canary_observations.c.id)
            )
            return [_observation_from_dict(r.observation, r.id) for r in rows]

    def set_approval_run(self, window_id: int, flow_run_id: str, replacing: str | None, actor: str) -> CanaryWindow:
        """Record which paused flow run waits for this window's sign-off (what ``loragate
        approve`` resumes) -- only while no run, or the run ``replacing`` names, holds it:
        two promotions triggered by one duplicated event cannot both wait."""
        with self._write() as conn:
            row = self._window_row(conn, window_id)
            if row.approval_flow_run_id in (None, replacing):
                conn.execute(
                    update(canary_windows)
                    .where(canary_windows.c.id == window_id)
                    .values(approval_flow_run_id=flow_run_id)
                )
                self._audit(
                    conn,
                    actor=actor,
                    action="approval_requested",
                    adapter_name=row.adapter_name,
                    version_id=row.version_id,
                    stage="production",
                    to_value=flow_run_id[:64],
                    details={"window_id": window_id, "flow_run_id": flow_run_id},
                )
            return _window_from_row(self._window_row(conn, window_id))

    def record_approval(
        self, window_id: int, *, approve: bool, reviewer: str, comment: str, flow_run_id: str | None, actor: str
    ) -> CanaryWindow:
        """The sign-off decision, in the audit log; a rejection closes the window.

        Raises:
            NotFound: no such window.
            IllegalTransition: the window is not waiting for a sign-off.
        """

        def attempt() -> CanaryWindow:
            now = utcnow()
            with self._write() as conn:
                row = self._window_row(conn, window_id)
                if row.status != WindowStatus.READY.value:
                    raise IllegalTransition(
                        f"canary window {window_id} of {row.version_id} is {row.status}, not waiting for a sign-off",
                        field="version_id",
                    )
                self._audit(
                    conn,
                    actor=actor,
                    action="approval",
                    adapter_name=row.adapter_name,
                    version_id=row.version_id,
                    stage="production",
                    to_value="approved" if approve else "rejected",
                    reason=comment or None,
                    at=now,
                    details={
                        "window_id": window_id,
                        "approve": approve,
                        "reviewer": reviewer,
                        "comment": comment,
                        "flow_run_id": flow_run_id,
                    },
                )
                if not approve:
                    why = f"rejected by {reviewer}: {comment}"
                    self._move_window(conn, row, WindowStatus.REJECTED, why, actor, now)
                return _window_from_row(self._window_row(conn, window_id))

        return self._retrying(attempt)


def _issued_fields(row: Any) -> dict[str, Any]:
    """The columns api_tokens and signing_keys share (``access.Issued``)."""
    return {
        "role": Role(row.role),
        "holder": row.holder,
        "created_at": _utc(row.created_at),
        "created_by": row.created_by,
        "revoked_at": _utc(row.revoked_at) if row.revoked_at is not None else None,
    }


def _token_from_row(row: Any) -> TokenRecord:
    return TokenRecord(token_id=row.token_id, namespace=row.namespace, **_issued_fields(row))


def _key_from_row(row: Any) -> SigningKey:
    return SigningKey(key_id=row.key_id, public_pem=row.public_pem.encode(), **_issued_fields(row))


def _window_from_row(row: Any) -> CanaryWindow:
    return CanaryWindow(
        id=row.id,
        adapter_name=row.adapter_name,
        version_id=row.version_id,
        status=WindowStatus(row.status),
        opened_at=_utc(row.opened_at),
        thresholds=CanaryThresholds.from_dict(row.thresholds),
        closed_at=_utc(row.closed_at) if row.closed_at else None,
        reason=row.reason,
        approval_flow_run_id=row.approval_flow_run_id,
    )


def _observation_from_dict(data: dict[str, Any], observation_id: int) -> Observation:
    return Observation(
        id=observation_id,
        window_id=data["window_id"],
        at=_utc(datetime.fromisoformat(data["at"])),
        canary=SideStats.from_dict(data["canary"]),
        production=SideStats.from_dict(data["production"]),
        drift=data["drift"],
        drifted_cases=list(data["drifted_cases"]),
        verdict=Verdict(data["verdict"]),
        monitors=[Monitor(**m) for m in data["monitors"]],
        reasons=list(data["reasons"]),
    )
