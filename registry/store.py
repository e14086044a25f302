"""SQL store of the registry (SQLAlchemy 2 Core) for Postgres (psycopg 3) and SQLite.

Every write is one transaction. A pointer move first claims the adapter's row with an
UPDATE that bumps its ``revision`` (the row lock on Postgres; ``BEGIN IMMEDIATE`` holds the
write lock on SQLite), plans from what it reads under that lock, and changes each version's
stage only if it is still the stage it planned from, so concurrent moves serialise and none
is lost. Rows are turned into domain objects before the connection is released.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

from sqlalchemy import String, and_, bindparam, case, create_engine, delete, event, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from registry import migrate
from registry.catalog import BaseModelRecord
from registry.domain import Adapter, AdapterVersion, AuditEvent, GoldenSetRef, ValidationRun
from registry.errors import AlreadyExists, ConcurrentUpdate, ErrorCode, InvalidInput, NotFound
from registry.lifecycle import Plan, Pointer, Stage, VersionState
from registry.names import AdapterName
from registry.schema import (
    adapter_versions,
    adapters,
    audit_events,
    base_models,
    golden_sets,
    stage_pointers,
    validation_runs,
)

MAX_ATTEMPTS = 8


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


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
        stage=m["stage"],
        validation_status=m["validation_status"],
        previous_version=m["previous_version"],
        manifest=m["manifest"],
        created_at=_utc(m["created_at"]),
        created_by=m["created_by"],
    )


def _run_from_row(row) -> ValidationRun:
    return ValidationRun(**{**row._mapping, "started_at": _utc(row.started_at), "finished_at": _utc(row.finished_at)})


class _NothingToDo(Exception):
    """Raised out of a write transaction to roll it back and return the (empty) plan."""


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
    adapters.c.id == select(adapter_versions.c.adapter_id).where(adapter_versions.c.version_id == bindparam("version_id")).scalar_subquery()
)
# Driven from the (at most four) wanted ids, so every lookup is by primary key whatever
# the number of versions: an OR of IN-subquery and equality makes Postgres scan the table.
_WANTED = (
    select(stage_pointers.c.version_id.label("version_id")).where(stage_pointers.c.adapter_id == bindparam("adapter_id"))
    .union(select(bindparam("subject", type_=String(64)).label("version_id")))
    .subquery("wanted")
)
_POINTERS_AND_STATES = (
    select(adapter_versions.c.version_id, adapter_versions.c.stage, adapter_versions.c.validation_status, stage_pointers.c.stage.label("pointer"))
    .select_from(
        _WANTED.join(adapter_versions, adapter_versions.c.version_id == _WANTED.c.version_id).outerjoin(
            stage_pointers,
            and_(stage_pointers.c.version_id == adapter_versions.c.version_id, stage_pointers.c.adapter_id == bindparam("adapter_id")),
        )
    )
)
_DELETE_POINTER = delete(stage_pointers).where(stage_pointers.c.adapter_id == bindparam("adapter_id"), stage_pointers.c.stage == bindparam("pointer"))


def _upsert_pointer_statement(dialect: str):
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    else:
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    stmt = dialect_insert(stage_pointers).values(
        adapter_id=bindparam("adapter_id"), stage=bindparam("pointer"), version_id=bindparam("version_id"), moved_at=bindparam("now")
    )
    return stmt.on_conflict_do_update(
        index_elements=["adapter_id", "stage"], set_={"version_id": stmt.excluded.version_id, "moved_at": stmt.excluded.moved_at}
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
        # the pointer's foreign key guarantees the version exists: no join needed
        self._resolve = (
            select(stage_pointers.c.version_id)
            .select_from(adapters.join(stage_pointers, stage_pointers.c.adapter_id == adapters.c.id))
            .where(adapters.c.name == bindparam("name"), stage_pointers.c.stage == bindparam("stage"))
        )

    @classmethod
    def from_url(cls, url: str) -> "SqlStore":
        return cls(make_engine(url))

    # -- schema ---------------------------------------------------------------

    def upgrade_schema(self) -> None:
        migrate.upgrade(self.engine)

    def check_schema(self) -> None:
        try:
            current = migrate.current_revision(self.engine)
        except OperationalError as e:
            raise InvalidInput(f"registry database unreachable: {e.orig}", code=ErrorCode.NOT_INITIALIZED, field="LORAGATE_DATABASE_URL")
        head = migrate.head_revision()
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
        with conn.connection.driver_connection.pipeline():
            yield

    def _retrying(self, fn: Callable[[], Any]) -> Any:
        for attempt in range(MAX_ATTEMPTS):
            try:
                return fn()
            except ConcurrentUpdate:
                if attempt == MAX_ATTEMPTS - 1:
                    raise
                time.sleep(0.002 * (attempt + 1))

    def _audit(self, conn: Connection, *, actor: str, action: str, adapter_name: str | None, version_id: str | None = None,
               stage: str | None = None, from_value: str | None = None, to_value: str | None = None,
               reason: str | None = None, details: dict | None = None, at: datetime | None = None) -> None:
        conn.execute(
            _INSERT_AUDIT,
            {"at": at or utcnow(), "actor": actor, "action": action, "adapter_name": adapter_name, "version_id": version_id,
             "stage": stage, "from_value": from_value, "to_value": to_value, "reason": reason, "details": details or {}},
        )

    # -- base catalog ---------------------------------------------------------

    def add_base(self, record: BaseModelRecord, actor: str) -> tuple[BaseModelRecord, bool]:
        existing = self.get_base(record.base_model_id, record.base_model_commit)
        if existing is not None:
            same = (existing.content_digest, existing.config_sha256) == (record.content_digest, record.config_sha256)
            if not same:
                raise AlreadyExists(f"base {record.label} is already pinned with other content", field="id")
            return existing, False
        now = utcnow()
        values = {k: v for k, v in record.__dict__.items() if k not in ("created_at", "created_by")}
        try:
            with self._write() as conn:
                conn.execute(insert(base_models).values(**values, created_at=now, created_by=actor))
                self._audit(conn, actor=actor, action="base_add", adapter_name=None, to_value=record.base_model_commit[:64],
                            details={"base_model_id": record.base_model_id, "source": record.source})
        except IntegrityError:
            return self.add_base(record, actor)
        return self.get_base(record.base_model_id, record.base_model_commit), True

    def get_base(self, base_model_id: str, commit: str) -> BaseModelRecord | None:
        with self.reader.connect() as conn:
            row = conn.execute(
                select(base_models).where(base_models.c.base_model_id == base_model_id, base_models.c.base_model_commit == commit)
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
                _VERSIONS_WITH_NAME.where(adapters.c.name == name, adapter_versions.c.content_address == content_address)
            ).first()
        return _version_from_row(row) if row else None

    def latest_version_id(self, name: str) -> str | None:
        with self.reader.connect() as conn:
            return self._latest_version_id(conn, name)

    def _latest_version_id(self, conn: Connection, name: str) -> str | None:
        return conn.execute(
            select(adapter_versions.c.version_id)
            .select_from(adapter_versions.join(adapters, adapters.c.id == adapter_versions.c.adapter_id))
            .where(adapters.c.name == name)
            .order_by(adapter_versions.c.created_at.desc(), adapter_versions.c.version_id.desc())
            .limit(1)
        ).scalar()

    def _adapter_id(self, conn: Connection, name: AdapterName, now: datetime) -> int:
        adapter_id = conn.execute(select(adapters.c.id).where(adapters.c.name == str(name))).scalar()
        if adapter_id is None:
            adapter_id = conn.execute(
                insert(adapters)
                .values(name=str(name), namespace=name.namespace, base=name.base, task=name.task, revision=0, created_at=now)
                .returning(adapters.c.id)
            ).scalar_one()
        return adapter_id

    def insert_version(self, name: AdapterName, values: dict[str, Any], *, expected_previous: str | None,
                       created_at: datetime, actor: str) -> AdapterVersion:
        """Insert one new version; ConcurrentUpdate if another version landed meanwhile."""
        try:
            with self._write() as conn:
                adapter_id = self._adapter_id(conn, name, created_at)
                self._lock_adapter(conn, adapter_id)
                if self._latest_version_id(conn, str(name)) != expected_previous:
                    raise ConcurrentUpdate(f"another version of {name} was registered meanwhile")
                row = conn.execute(
                    insert(adapter_versions)
                    .values(**values, adapter_id=adapter_id, previous_version=expected_previous, created_at=created_at, created_by=actor)
                    .returning(*adapter_versions.c)
                ).first()
                self._audit(conn, actor=actor, action="register", adapter_name=str(name), version_id=values["version_id"],
                            to_value=Stage.STAGING.value, at=created_at,
                            details={"content_address": values["content_address"], "weights_sha256": values["weights_sha256"]})
        except IntegrityError as e:
            raise ConcurrentUpdate(f"version row for {name} collided: {e.orig}")
        return _version_from_row(row, name=str(name))

    def version_id_taken(self, version_id: str) -> bool:
        with self.reader.connect() as conn:
            return conn.execute(select(adapter_versions.c.version_id).where(adapter_versions.c.version_id == version_id)).first() is not None

    def get_version(self, version_id: str) -> AdapterVersion:
        with self.reader.connect() as conn:
            row = conn.execute(_VERSIONS_WITH_NAME.where(adapter_versions.c.version_id == version_id)).first()
        if row is None:
            raise NotFound(f"no adapter version {version_id!r}", field="version")
        return _version_from_row(row)

    def list_versions(self, name: str | None = None) -> list[AdapterVersion]:
        stmt = _VERSIONS_WITH_NAME.order_by(adapters.c.name, adapter_versions.c.created_at, adapter_versions.c.version_id)
        if name is not None:
            stmt = stmt.where(adapters.c.name == name)
        with self.reader.connect() as conn:
            return [_version_from_row(r) for r in conn.execute(stmt)]

    # -- adapters and pointers ------------------------------------------------

    def get_adapter(self, name: str) -> Adapter:
        with self.reader.connect() as conn:
            row = conn.execute(select(adapters).where(adapters.c.name == name)).first()
            if row is None:
                raise NotFound(f"no adapter named {name!r}", field="name")
            pointers = self._pointers(conn, row.id)
            count = conn.execute(select(func.count()).where(adapter_versions.c.adapter_id == row.id)).scalar_one()
        return Adapter(
            name=row.name, canary=pointers.get(Pointer.CANARY), production=pointers.get(Pointer.PRODUCTION),
            previous=pointers.get(Pointer.PREVIOUS), revision=row.revision, version_count=count, created_at=_utc(row.created_at),
        )

    def resolve(self, name: str, stage: str) -> str | None:
        """The version a stage pointer names: one indexed join, the hot path of serving."""
        with self.reader.connect() as conn:
            return conn.execute(self._resolve, {"name": name, "stage": stage}).scalar()

    def deployed_at(self, name: str, stage: str) -> datetime | None:
        with self.reader.connect() as conn:
            return _utc(
                conn.execute(
                    select(stage_pointers.c.moved_at)
                    .select_from(stage_pointers.join(adapters, adapters.c.id == stage_pointers.c.adapter_id))
                    .where(adapters.c.name == name, stage_pointers.c.stage == stage)
                ).scalar()
            )

    def _pointers(self, conn: Connection, adapter_id: int) -> dict[Pointer, str]:
        rows = conn.execute(
            select(stage_pointers.c.stage, stage_pointers.c.version_id).where(stage_pointers.c.adapter_id == adapter_id)
        )
        return {Pointer(r.stage): r.version_id for r in rows}

    def _lock_adapter(self, conn: Connection, adapter_id: int) -> int:
        return conn.execute(select(adapters.c.revision).where(adapters.c.id == adapter_id).with_for_update()).scalar_one()

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
        """The adapter's pointers and the states of every version they or ``subject`` name."""
        pointers: dict[Pointer, str] = {}
        states: dict[str, VersionState] = {}
        for r in conn.execute(_POINTERS_AND_STATES, {"adapter_id": adapter_id, "subject": subject}):
            states[r.version_id] = VersionState(r.version_id, Stage(r.stage), r.validation_status)
            if r.pointer is not None:
                pointers[Pointer(r.pointer)] = r.version_id
        return pointers, states

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
    ) -> Plan:
        """Plan under the adapter's row lock and apply atomically; retried on a lost race.

        The adapter is named by ``name`` or found from the ``subject`` version.
        """

        def attempt() -> Plan:
            with self._write() as conn:
                row = self._claim(conn, name, subject)
                if row is None:
                    raise NotFound(f"no adapter named {name!r}", field="name") if name else NotFound(f"no adapter version {subject!r}", field="version")
                pointers, states = self._pointers_and_states(conn, row.id, subject)
                if subject is not None and subject not in states:
                    raise NotFound(f"no adapter version {subject!r}", field="version")
                plan = planner(pointers, states)
                if before_commit is not None:
                    before_commit(conn)
                if plan.empty and plan.action != "validate":
                    raise _NothingToDo(plan)  # roll back the revision bump
                now = utcnow()
                if plan.stage_changes:
                    changed = conn.execute(
                        update(adapter_versions)
                        .where(or_(*[and_(adapter_versions.c.version_id == v, adapter_versions.c.stage == a.value) for v, a, _ in plan.stage_changes]))
                        .values(stage=case({v: b.value for v, _, b in plan.stage_changes}, value=adapter_versions.c.version_id))
                    ).rowcount
                    if changed != len(plan.stage_changes):
                        raise ConcurrentUpdate(f"a version of {row.name} changed stage meanwhile")
                # nothing below returns anything we read: one round trip for all of it
                with self._pipelined(conn):
                    for pointer, version_id in plan.pointer_changes.items():
                        if version_id is None:
                            conn.execute(_DELETE_POINTER, {"adapter_id": row.id, "pointer": pointer.value})
                        else:
                            conn.execute(self._upsert_pointer, {"adapter_id": row.id, "pointer": pointer.value, "version_id": version_id, "now": now})
                    self._audit(
                        conn, actor=actor, action=plan.action, adapter_name=row.name, version_id=plan.subject,
                        stage=plan.audit_stage.value if plan.audit_stage else None,
                        from_value=plan.audit_from, to_value=plan.audit_to, reason=reason, at=now,
                        details={**(details or {}), "stage_changes": [[v, a.value, b.value] for v, a, b in plan.stage_changes]},
                    )
                return plan

        try:
            return self._retrying(attempt)
        except _NothingToDo as done:
            return done.args[0]

    # -- audit ----------------------------------------------------------------

    def history(self, name: str) -> list[AuditEvent]:
        self.get_adapter(name)
        with self.reader.connect() as conn:
            rows = conn.execute(select(audit_events).where(audit_events.c.adapter_name == name).order_by(audit_events.c.id))
            return [AuditEvent(**{**r._mapping, "at": _utc(r.at)}) for r in rows]

    def audit_count(self) -> int:
        with self.reader.connect() as conn:
            return conn.execute(select(func.count()).select_from(audit_events)).scalar_one()

    # -- golden sets ----------------------------------------------------------

    def attach_golden_set(self, name: str, digest: str, case_count: int, actor: str) -> GoldenSetRef:
        now = utcnow()
        with self._write() as conn:
            adapter_id = conn.execute(select(adapters.c.id).where(adapters.c.name == name)).scalar()
            if adapter_id is None:
                raise NotFound(f"no adapter named {name!r}; register a version first", field="name")
            conn.execute(insert(golden_sets).values(adapter_id=adapter_id, digest=digest, case_count=case_count, attached_at=now, attached_by=actor))
            self._audit(conn, actor=actor, action="golden_set", adapter_name=name, to_value=digest[:64], at=now, details={"cases": case_count})
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

    def record_validation(self, version: AdapterVersion, planner: Callable[[VersionState], Plan], run: dict[str, Any], actor: str) -> ValidationRun:
        """Store a run's report and apply its lifecycle consequence in one transaction."""
        status = run["status"]
        inserted: dict[str, int] = {}

        def write_run(conn: Connection) -> None:
            inserted["id"] = conn.execute(
                insert(validation_runs).values(version_id=version.version_id, actor=actor, **run).returning(validation_runs.c.id)
            ).scalar_one()
            conn.execute(update(adapter_versions).where(adapter_versions.c.version_id == version.version_id).values(validation_status=status))

        self.apply_plan(
            lambda pointers, states: planner(states[version.version_id]),
            subject=version.version_id,
            actor=actor,
            reason=run["report"].get("summary"),
            details={"status": status, "output_sha256": run.get("output_sha256"), "golden_set": run.get("golden_set_digest")},
            before_commit=write_run,
        )
        return self.validation_run(inserted["id"])

    def validation_run(self, run_id: int) -> ValidationRun:
        with self.reader.connect() as conn:
            row = conn.execute(select(validation_runs).where(validation_runs.c.id == run_id)).first()
        return _run_from_row(row)

    def validation_runs(self, version_id: str) -> list[ValidationRun]:
        with self.reader.connect() as conn:
            rows = conn.execute(select(validation_runs).where(validation_runs.c.version_id == version_id).order_by(validation_runs.c.id))
            return [_run_from_row(r) for r in rows]

    def latest_passed_run_before(self, name: str, created_before: datetime, exclude_version: str) -> ValidationRun | None:
        """The newest passed run of an older version of ``name``: the drift reference."""
        with self.reader.connect() as conn:
            run_id = conn.execute(
                select(validation_runs.c.id)
                .select_from(
                    validation_runs.join(adapter_versions, adapter_versions.c.version_id == validation_runs.c.version_id).join(
                        adapters, adapters.c.id == adapter_versions.c.adapter_id
                    )
                )
                .where(
                    and_(
                        adapters.c.name == name,
                        validation_runs.c.status == "passed",
                        adapter_versions.c.created_at <= created_before,
                        adapter_versions.c.version_id != exclude_version,
                    )
                )
                .order_by(adapter_versions.c.created_at.desc(), validation_runs.c.id.desc())
                .limit(1)
            ).scalar()
        return self.validation_run(run_id) if run_id is not None else None
