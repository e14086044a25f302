"""A canary window's share: the fraction of the adapter's live requests its version answers
(migrations 0011 and 0012). Only an open or ready window has one; each change is a
compare-and-set on the share and status read, audited with what it replaced
(``canary_share``). Above the cap a change takes a person's sign-off pending, asked in the
change's own transaction (``CapLift``); the windows themselves are ``db/canary.py``'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Connection

from loragate.registry.db.canary import CanaryRepository, window_from_row
from loragate.registry.db.database import Database
from loragate.registry.db.schema import canary_windows
from loragate.registry.errors import ConcurrentUpdate, IllegalTransition
from loragate.registry.rules.canary import ACTIVE, CanaryWindow, WindowStatus
from loragate.registry.rules.share import above_cap, needs_sign_off

# whether the caller may raise this window's share above the cap, asked in the change's own
# transaction with the window's row (a person's sign-off pending: db/sign_offs.py)
CapLift = Callable[[Connection, Any], bool]


class CanaryShareRepository:
    def __init__(self, db: Database, windows: CanaryRepository):
        self.db = db
        self.windows = windows

    def set_share(
        self,
        window_id: int,
        share: float,
        actor: str,
        reason: str | None = None,
        *,
        cap: float = 1.0,
        lift: CapLift | None = None,
    ) -> CanaryWindow:
        """Set an active window's share of live requests; the same share again is a no-op
        (nothing audited). The change is a compare-and-set on the share and status read, so
        two changes racing are applied one after the other, each audited with what it
        replaced (``canary_share``). Raising it above ``cap`` takes ``lift`` saying yes in
        the same transaction.

        Raises:
            NotFound: no such window.
            IllegalTransition: the window is closed (only an open or ready one has a share).
            PermissionDenied: SHARE_ABOVE_CAP, above ``cap`` and not lifted.
        """

        def attempt() -> CanaryWindow:
            with self.db.write() as conn:
                row = self.windows.window_row(conn, window_id)
                if WindowStatus(row.status) not in ACTIVE:
                    raise IllegalTransition(
                        f"canary window {window_id} of {row.version_id} is {row.status}: "
                        "only an open or ready window has a share of live requests",
                        field="status",
                    )
                if row.share == share:
                    return window_from_row(row)
                if not self._within_cap(conn, row, share, cap, lift):
                    raise above_cap(share, cap, row.version_id)
                done = conn.execute(
                    update(canary_windows)
                    .where(
                        canary_windows.c.id == window_id,
                        canary_windows.c.status.in_([s.value for s in ACTIVE]),
                        canary_windows.c.share == row.share,
                    )
                    .values(share=share)
                ).rowcount
                if done != 1:
                    raise ConcurrentUpdate(f"canary window {window_id} changed meanwhile", field="share")
                self.db.audit(
                    conn,
                    actor=actor,
                    action="canary_share",
                    adapter_name=row.adapter_name,
                    version_id=row.version_id,
                    stage="canary",
                    from_value=repr(row.share),
                    to_value=repr(share),
                    reason=reason,
                    details={"window_id": window_id, "from": row.share, "to": share, "reason": reason},
                )
                return window_from_row(self.windows.window_row(conn, window_id))

        return self.db.retrying(attempt)

    @staticmethod
    def _within_cap(conn: Connection, row: Any, share: float, cap: float, lift: CapLift | None) -> bool:
        return not needs_sign_off(share, row.share, cap) or (lift is not None and lift(conn, row))

    def share_allowed(self, window_id: int, share: float, *, cap: float, lift: CapLift | None) -> bool:
        """Whether ``set_share`` would take ``share`` for the window now, as far as the cap
        goes: a look, not a reservation (the change decides again in its transaction).

        Raises:
            NotFound: no such window.
        """
        with self.db.reader.connect() as conn:
            return self._within_cap(conn, self.windows.window_row(conn, window_id), share, cap, lift)
