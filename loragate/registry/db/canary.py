"""The canary watch: a window per version on canary (open, ready for sign-off, then
promoted, rolled back, rejected or superseded) and the flow run waiting for its sign-off
(the decision itself is ``db/approvals.py``). A window's status moves only along
``WINDOW_MOVES``, each move a compare-and-set on the status it was read at; the moves a
verdict makes come with its observation (``db/canary_verdicts.py``). Each window gets a
random ``bucket_key`` when it opens, which the replicas key users' buckets with; nothing
here ever reads it back. The share of live requests a window answers, once it is open, is
``db/canary_share.py``'s."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import adapters, canary_observations, canary_windows, stage_pointers
from loragate.registry.errors import ConcurrentUpdate, IllegalTransition, NotFound
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.canary import (
    ACTIVE,
    VERDICT_MOVES,
    WINDOW_MOVES,
    CanaryThresholds,
    CanaryWindow,
    WindowStatus,
    override_required,
    window_end,
)
from loragate.registry.rules.lifecycle import Pointer

# the unique index over an adapter's active windows (schema.py, migration 0008)
ONE_ACTIVE_WINDOW = "uq_canary_windows_one_active"
# a window as the roles read it: every column but the replicas' bucket secret (0015)
WINDOW_COLUMNS = tuple(c for c in canary_windows.c if c.name != "bucket_key")


def window_from_row(row: Any) -> CanaryWindow:
    return CanaryWindow(
        id=row.id,
        adapter_name=row.adapter_name,
        version_id=row.version_id,
        status=WindowStatus(row.status),
        opened_at=utc(row.opened_at),
        thresholds=CanaryThresholds.from_dict(row.thresholds),
        closed_at=utc(row.closed_at) if row.closed_at else None,
        reason=row.reason,
        approval_flow_run_id=row.approval_flow_run_id,
        share=row.share,
    )


class CanaryRepository:
    def __init__(self, db: Database):
        self.db = db

    def open_window(
        self, name: str, version_id: str, thresholds: CanaryThresholds, actor: str, share: float = 0.0
    ) -> tuple[CanaryWindow, bool]:
        """Open a window for ``version_id`` answering ``share`` of the adapter's live
        requests, or return its active one as it is; returns (window, created).

        Any other active window of the adapter is superseded: one canary at a time. The
        database keeps it so (a unique index over the active windows, migration 0008): an
        opening that loses a race is retried and finds the winner's window. The version is
        the canary as read under the adapter's row lock, the lock every pointer move takes:
        a move that takes the canary away either comes first (and this refuses) or after
        (and ends this window in its own transaction, ``end_departed``).

        Raises:
            IllegalTransition: ``version_id`` is not the adapter's canary.
        """

        def attempt() -> tuple[CanaryWindow, bool]:
            now = utcnow()
            with self.db.write() as conn:
                adapter_id = conn.execute(
                    select(adapters.c.id).where(adapters.c.name == name).with_for_update()
                ).scalar_one()
                canary = conn.execute(
                    select(stage_pointers.c.version_id).where(
                        stage_pointers.c.adapter_id == adapter_id, stage_pointers.c.stage == Pointer.CANARY.value
                    )
                ).scalar_one_or_none()
                if canary != version_id:
                    raise IllegalTransition(
                        f"{version_id} is not the canary of {name}: promote it to canary first", field="version_id"
                    )
                active = conn.execute(
                    select(*WINDOW_COLUMNS)
                    .where(
                        canary_windows.c.adapter_name == name,
                        canary_windows.c.status.in_([s.value for s in ACTIVE]),
                    )
                    .order_by(canary_windows.c.id)
                ).all()
                mine = [r for r in active if r.version_id == version_id]
                if mine:
                    return window_from_row(mine[-1]), False
                for row in active:
                    self.move_in(conn, row, WindowStatus.SUPERSEDED, f"{version_id} entered canary", actor, now)
                window_id = self._insert_window(conn, name, version_id, thresholds, share, now)
                self.db.audit(
                    conn,
                    actor=actor,
                    action="canary_window",
                    adapter_name=name,
                    version_id=version_id,
                    stage="canary",
                    to_value=WindowStatus.OPEN.value,
                    at=now,
                    details={"window_id": window_id, "thresholds": thresholds.as_dict(), "share": share},
                )
                row = conn.execute(select(*WINDOW_COLUMNS).where(canary_windows.c.id == window_id)).one()
            return window_from_row(row), True

        return self.db.retrying(attempt)

    def _insert_window(
        self, conn: Connection, name: str, version_id: str, thresholds: CanaryThresholds, share: float, now: datetime
    ) -> int:
        try:
            return conn.execute(
                insert(canary_windows)
                .values(
                    adapter_name=name,
                    version_id=version_id,
                    status=WindowStatus.OPEN.value,
                    opened_at=now,
                    thresholds=thresholds.as_dict(),
                    share=share,
                    # Postgres draws its own at INSERT (migration 0012), whatever is written here
                    bucket_key=secrets.token_hex(32),
                )
                .returning(canary_windows.c.id)
            ).scalar_one()
        except IntegrityError as e:
            # Postgres names the constraint; SQLite's writers are serialized and never get here
            if getattr(getattr(e.orig, "diag", None), "constraint_name", None) == ONE_ACTIVE_WINDOW:
                raise ConcurrentUpdate(f"another canary window of {name} opened meanwhile", field="status") from e
            raise

    def move_in(
        self, conn: Connection, row: Any, to: WindowStatus, reason: str | None, actor: str, now: datetime
    ) -> bool:
        """Move a window's status under its current value (compare and set); False when it
        was already there. Raises IllegalTransition for a move the table forbids, or one only
        a verdict makes (``record_observation``)."""
        current = WindowStatus(row.status)
        if current == to:
            return False
        if to in VERDICT_MOVES.values():
            raise IllegalTransition(
                f"canary window {row.id} of {row.version_id} becomes {to.value} only with the evaluation's "
                "observation that decides it",
                field="status",
            )
        if to not in WINDOW_MOVES.get(current, frozenset()):
            raise IllegalTransition(
                f"canary window {row.id} of {row.version_id} is {current.value}, it cannot become {to.value}",
                field="status",
            )
        self.set_status(conn, row, to, reason, now)
        self.audit_move(conn, row, current, to, reason, actor, now)
        return True

    @staticmethod
    def set_status(conn: Connection, row: Any, to: WindowStatus, reason: str | None, now: datetime) -> None:
        """The window of ``row`` moved to ``to`` in ``conn``, compared and set on the status read.

        Raises:
            ConcurrentUpdate: the window's status changed since ``row`` was read.
        """
        done = conn.execute(
            update(canary_windows)
            .where(canary_windows.c.id == row.id, canary_windows.c.status == row.status)
            .values(
                status=to.value,
                reason=reason,
                closed_at=None if to == WindowStatus.READY else now,
            )
        ).rowcount
        if done != 1:
            raise ConcurrentUpdate(f"canary window {row.id} changed meanwhile", field="status")

    def audit_move(
        self,
        conn: Connection,
        row: Any,
        current: WindowStatus,
        to: WindowStatus,
        reason: str | None,
        actor: str,
        now: datetime,
    ) -> None:
        self.db.audit(
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

    def end_departed(
        self,
        conn: Connection,
        name: str,
        canary: str | None,
        *,
        promoted: str | None,
        withdrawn: bool,
        reason: str | None,
        actor: str,
        now: datetime,
        override: bool = False,
    ) -> None:
        """In a pointer move's transaction, under the adapter's lock: every active window of
        ``name`` whose version is not ``canary`` (the pointer as the move leaves it) ends as
        ``window_end`` says -- so no window is active for a version that is not the canary,
        whoever moves the pointer and whatever happens to the caller afterwards. A window
        still observing is promoted past (``superseded``) only on a person's ``override``.

        Raises:
            IllegalTransition: OVERRIDE_REQUIRED, ``promoted`` is a version whose window is
                still open and ``override`` was not given (the move rolls back).
        """
        departed = conn.execute(
            select(*WINDOW_COLUMNS).where(
                canary_windows.c.adapter_name == name,
                canary_windows.c.status.in_([s.value for s in ACTIVE]),
            )
        ).all()
        for row in departed:
            if row.version_id == canary:
                continue
            status = WindowStatus(row.status)
            if row.version_id == promoted and status == WindowStatus.OPEN and not override:
                raise override_required(row.id, row.version_id)
            ended = window_end(status, promoted=row.version_id == promoted, withdrawn=withdrawn)
            why = reason or f"{row.version_id} left canary ({ended.value})"
            self.move_in(conn, row, ended, why, actor, now)

    def move_window(self, window_id: int, to: WindowStatus, reason: str | None, actor: str) -> CanaryWindow:
        """Raises:
        NotFound: no such window.
        IllegalTransition: the window's status cannot move to ``to``.
        """

        def attempt() -> CanaryWindow:
            with self.db.write() as conn:
                row = self.window_row(conn, window_id)
                self.move_in(conn, row, to, reason, actor, utcnow())
                return window_from_row(self.window_row(conn, window_id))

        return self.db.retrying(attempt)

    def window_row(self, conn: Connection, window_id: int, *, lock: bool = False) -> Any:
        """The window's row, read in ``conn``'s transaction (``lock``: held to its end).

        Raises:
            NotFound: no such window.
        """
        query = select(*WINDOW_COLUMNS).where(canary_windows.c.id == window_id)
        row = conn.execute(query.with_for_update() if lock else query).first()
        if row is None:
            raise NotFound(f"no canary window {window_id}", field="window_id")
        return row

    def window(self, window_id: int) -> CanaryWindow:
        with self.db.reader.connect() as conn:
            return window_from_row(self.window_row(conn, window_id))

    def windows(
        self,
        *,
        statuses: tuple[WindowStatus, ...] | None = None,
        version_id: str | None = None,
        adapter_name: str | None = None,
        least_recently_observed: bool = False,
    ) -> list[CanaryWindow]:
        query = select(*WINDOW_COLUMNS)
        if least_recently_observed:
            # never observed first, then by the latest observation: a window an evaluation had
            # no time for (``canary-evaluate``'s budget) is the next one's first
            last = (
                select(func.max(canary_observations.c.at))
                .where(canary_observations.c.window_id == canary_windows.c.id)
                .scalar_subquery()
            )
            query = query.order_by(last.asc().nulls_first(), canary_windows.c.id)
        else:
            query = query.order_by(canary_windows.c.id)
        if adapter_name is not None:
            query = query.where(canary_windows.c.adapter_name == adapter_name)
        if statuses is not None:
            query = query.where(canary_windows.c.status.in_([s.value for s in statuses]))
        if version_id is not None:
            query = query.where(canary_windows.c.version_id == version_id)
        with self.db.reader.connect() as conn:
            return [window_from_row(r) for r in conn.execute(query)]

    def set_approval_run(self, window_id: int, flow_run_id: str, replacing: str | None, actor: str) -> CanaryWindow:
        """Record which paused flow run waits for this window's sign-off (what ``loragate
        approve`` resumes) -- only while no run, or the run ``replacing`` names, holds it:
        two promotions triggered by one duplicated event cannot both wait. The claim is a
        compare-and-set in the UPDATE's WHERE clause; the returned window names the holder.
        """
        with self.db.write() as conn:
            row = self.window_row(conn, window_id)
            free: ColumnElement[bool] = canary_windows.c.approval_flow_run_id.is_(None)
            if replacing is not None:
                free = or_(free, canary_windows.c.approval_flow_run_id == replacing)
            claimed = conn.execute(
                update(canary_windows)
                .where(canary_windows.c.id == window_id, free)
                .values(approval_flow_run_id=flow_run_id)
            ).rowcount
            if claimed == 1:
                self.db.audit(
                    conn,
                    actor=actor,
                    action="approval_requested",
                    adapter_name=row.adapter_name,
                    version_id=row.version_id,
                    stage="production",
                    to_value=flow_run_id[:64],
                    details={"window_id": window_id, "flow_run_id": flow_run_id},
                )
            return window_from_row(self.window_row(conn, window_id))
