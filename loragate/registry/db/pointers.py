"""Adapters and their stage pointers (canary, production, previous), and the claim a
pointer move is made under.

A claim bumps the adapter row's ``revision`` with one UPDATE: that takes the row lock on
Postgres (``BEGIN IMMEDIATE`` holds the write lock on SQLite), so concurrent moves of one
adapter serialise. Under it the pointers and the states of every version they name are
read in one query; a plan made from them is written with each stage change guarded by
the stage it was planned from (compare-and-set), so no move is lost. A claim that writes
nothing rolls its revision bump back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy import String, and_, bindparam, case, delete, func, or_, select, update
from sqlalchemy.engine import Connection

from loragate.registry.db.canary import CanaryRepository
from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import adapter_versions, adapters, stage_pointers
from loragate.registry.errors import ConcurrentUpdate, NotFound
from loragate.registry.records.adapters import Adapter, utcnow
from loragate.registry.rules.fleet import AdapterPointers
from loragate.registry.rules.lifecycle import Plan, Pointer, Stage, ValidationStatus, VersionState

T = TypeVar("T")

# Statements on the pointer-move path are built once: constructing them per call costs
# more than their round trips.
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
_DELETE_POINTER = delete(stage_pointers).where(
    stage_pointers.c.adapter_id == bindparam("adapter_id"), stage_pointers.c.stage == bindparam("pointer")
)
# the pointer's foreign key guarantees the version exists: no join needed
_RESOLVE = (
    select(stage_pointers.c.version_id)
    .select_from(adapters.join(stage_pointers, stage_pointers.c.adapter_id == adapters.c.id))
    .where(adapters.c.name == bindparam("name"), stage_pointers.c.stage == bindparam("stage"))
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


def _upsert_pointer_statement(db: Database):
    stmt = db.insert_statement()(stage_pointers).values(
        adapter_id=bindparam("adapter_id"),
        stage=bindparam("pointer"),
        version_id=bindparam("version_id"),
        moved_at=bindparam("now"),
    )
    return stmt.on_conflict_do_update(
        index_elements=["adapter_id", "stage"],
        set_={"version_id": stmt.excluded.version_id, "moved_at": stmt.excluded.moved_at},
    )


class _Unchanged(Exception):
    """Raised inside a claim's transaction to roll back a claim that wrote nothing."""


@dataclass
class ClaimedAdapter:
    """An adapter whose row this transaction holds: what its pointers name, the states and
    blob digests (weights, adapter config, manifest) of those versions and of the subject,
    and the writes that commit together when the claim ends."""

    id: int
    name: str
    pointers: dict[Pointer, str]
    states: dict[str, VersionState]
    blobs: dict[str, tuple[str, str, str]]
    _conn: Connection
    _repository: PointerRepository
    changed: bool = field(default=False, init=False)

    def apply(
        self, plan: Plan, *, actor: str, reason: str | None, details: dict | None = None, override: bool = False
    ) -> None:
        """Write the plan: stage changes (each only from the stage planned from), pointers,
        and its audit event. A plan that writes nothing leaves the claim unchanged.
        ``override``: a person's, promoting past a window still observing.

        Raises:
            ConcurrentUpdate: a version changed stage since it was read.
            IllegalTransition: OVERRIDE_REQUIRED (``CanaryRepository.end_departed``).
        """
        if plan.writes_nothing:
            return
        self._repository.write_plan(
            self._conn, self, plan, actor=actor, reason=reason, details=details, override=override
        )
        self.changed = True

    def record(self, write: Callable[[Connection], T]) -> T:
        """Run ``write`` in the claim's transaction (a row that commits with the move)."""
        self.changed = True
        return write(self._conn)

    def audit(self, actor: str, action: str, entries: list[dict[str, Any]], reason: str | None) -> None:
        """One audit event per fleet action, in the claim's transaction."""
        audit_fleet_actions(self._repository.db, self._conn, actor, action, entries, reason)


class PointerRepository:
    def __init__(self, db: Database):
        self.db = db
        self._upsert_pointer = _upsert_pointer_statement(db)
        self._windows = CanaryRepository(db)

    # -- reads ------------------------------------------------------------------

    def adapter(self, name: str) -> Adapter:
        """Raises:
        NotFound: no such adapter.
        """
        with self.db.reader.connect() as conn:
            row = conn.execute(select(adapters).where(adapters.c.name == name)).first()
            if row is None:
                raise NotFound(f"no adapter named {name!r}", field="name")
            pointers = {
                Pointer(r.stage): r.version_id
                for r in conn.execute(
                    select(stage_pointers.c.stage, stage_pointers.c.version_id).where(
                        stage_pointers.c.adapter_id == row.id
                    )
                )
            }
            count = conn.execute(select(func.count()).where(adapter_versions.c.adapter_id == row.id)).scalar_one()
        return Adapter(
            name=row.name,
            canary=pointers.get(Pointer.CANARY),
            production=pointers.get(Pointer.PRODUCTION),
            previous=pointers.get(Pointer.PREVIOUS),
            revision=row.revision,
            version_count=count,
            created_at=utc(row.created_at),
        )

    def resolve(self, name: str, stage: str) -> str | None:
        """The version a stage pointer names: one indexed join, the hot path of serving."""
        with self.db.reader.connect() as conn:
            return conn.execute(_RESOLVE, {"name": name, "stage": stage}).scalar()

    def moved_at(self, name: str, stage: str) -> datetime | None:
        with self.db.reader.connect() as conn:
            moved_at = conn.execute(
                select(stage_pointers.c.moved_at)
                .select_from(stage_pointers.join(adapters, adapters.c.id == stage_pointers.c.adapter_id))
                .where(adapters.c.name == name, stage_pointers.c.stage == stage)
            ).scalar()
        return utc(moved_at) if moved_at is not None else None

    def all_pointers(self, base_model_id: str | None = None) -> list[AdapterPointers]:
        """Every adapter's canary, production and previous pointer (of one base, or all)."""
        stmt = select(
            adapters.c.name,
            adapters.c.base,
            stage_pointers.c.stage,
            stage_pointers.c.version_id,
            stage_pointers.c.moved_at,
        ).select_from(adapters.outerjoin(stage_pointers, stage_pointers.c.adapter_id == adapters.c.id))
        if base_model_id is not None:
            stmt = stmt.where(adapters.c.base == base_model_id)
        found: dict[str, dict[str, str]] = {}
        bases: dict[str, str] = {}
        since: dict[str, datetime] = {}
        with self.db.reader.connect() as conn:
            for r in conn.execute(stmt):
                bases[r.name] = r.base
                pointers = found.setdefault(r.name, {})
                if r.stage is not None:
                    pointers[r.stage] = r.version_id
                if r.stage == Pointer.PRODUCTION.value:
                    since[r.name] = utc(r.moved_at)
        return [
            AdapterPointers(
                name,
                bases[name],
                p.get(Pointer.CANARY.value),
                p.get(Pointer.PRODUCTION.value),
                p.get(Pointer.PREVIOUS.value),
                since.get(name),
            )
            for name, p in sorted(found.items())
        ]

    # -- the claim ----------------------------------------------------------------

    @contextmanager
    def claim(self, *, name: str | None = None, subject: str | None = None) -> Iterator[ClaimedAdapter]:
        """Hold the adapter's row (named, or found from the ``subject`` version) for one
        transaction; what the block writes through the claim commits when it ends, and
        nothing does if it raises.

        Raises:
            NotFound: no such adapter, or no such subject version.
        """
        try:
            with self.db.write() as conn:
                if name is not None:
                    row = conn.execute(_CLAIM_BY_NAME, {"adapter_name": name}).first()
                else:
                    row = conn.execute(_CLAIM_BY_VERSION, {"version_id": subject}).first()
                if row is None:
                    raise (
                        NotFound(f"no adapter named {name!r}", field="name")
                        if name
                        else NotFound(f"no adapter version {subject!r}", field="version")
                    )
                claimed = ClaimedAdapter(row.id, row.name, {}, {}, {}, conn, self)
                for r in conn.execute(_POINTERS_AND_STATES, {"adapter_id": row.id, "subject": subject}):
                    claimed.states[r.version_id] = VersionState(
                        r.version_id, Stage(r.stage), ValidationStatus(r.validation_status)
                    )
                    claimed.blobs[r.version_id] = (r.weights_sha256, r.adapter_config_sha256, r.manifest_sha256)
                    if r.pointer is not None:
                        claimed.pointers[Pointer(r.pointer)] = r.version_id
                if subject is not None and subject not in claimed.states:
                    raise NotFound(f"no adapter version {subject!r}", field="version")
                yield claimed
                if not claimed.changed:
                    raise _Unchanged  # roll back the revision bump
        except _Unchanged:
            pass

    def write_plan(
        self,
        conn: Connection,
        claimed: ClaimedAdapter,
        plan: Plan,
        *,
        actor: str,
        reason: str | None,
        details: dict | None,
        override: bool = False,
    ) -> None:
        """Raises:
        ConcurrentUpdate: a version changed stage since the claim read it.
        IllegalTransition: OVERRIDE_REQUIRED (``CanaryRepository.end_departed``).
        """
        now = utcnow()
        if plan.stage_changes:
            params: dict[str, str] = {}
            for i, (moved, before, after) in enumerate(plan.stage_changes):
                params |= {f"v{i}": moved, f"from{i}": before.value, f"to{i}": after.value}
            changed = conn.execute(_stage_update(len(plan.stage_changes)), params).rowcount
            if changed != len(plan.stage_changes):
                raise ConcurrentUpdate(f"a version of {claimed.name} changed stage meanwhile")
        # nothing below returns anything we read: one round trip for all of it
        with self.db.pipelined(conn):
            for pointer, version_id in plan.pointer_changes.items():
                if version_id is None:
                    conn.execute(_DELETE_POINTER, {"adapter_id": claimed.id, "pointer": pointer.value})
                else:
                    conn.execute(
                        self._upsert_pointer,
                        {"adapter_id": claimed.id, "pointer": pointer.value, "version_id": version_id, "now": now},
                    )
            self.db.audit(
                conn,
                actor=actor,
                action=plan.action,
                adapter_name=claimed.name,
                version_id=plan.subject,
                stage=plan.audit_stage.value if plan.audit_stage else None,
                from_value=plan.audit_from,
                to_value=plan.audit_to,
                reason=reason,
                at=now,
                details={
                    **(details or {}),
                    **({"override": True} if override else {}),
                    "stage_changes": [[v, a.value, b.value] for v, a, b in plan.stage_changes],
                },
            )
        if Pointer.CANARY in plan.pointer_changes:
            # the version leaving canary takes its window with it, in this transaction
            self._windows.end_departed(
                conn,
                claimed.name,
                plan.pointer_changes[Pointer.CANARY],
                promoted=plan.pointer_changes.get(Pointer.PRODUCTION),
                withdrawn=plan.action == "rollback",
                reason=reason,
                actor=actor,
                now=now,
                override=override,
            )


def audit_fleet_actions(
    db: Database, conn: Connection, actor: str, action: str, entries: list[dict[str, Any]], reason: str | None
) -> None:
    """One audit event per fleet action (a switch, a load, an unload on one replica)."""
    for entry in entries:
        db.audit(
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
