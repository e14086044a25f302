"""Sign-offs a production move spends: the redeemed approve code it applies (consumes) in
its own transaction, the code a person's own move issues to their token and uses at once,
and whether a sign-off waits for the promotion (what lifts a canary's share above the cap).
Codes are issued and redeemed in ``db/approvals.py``; on Postgres a code is applied only
through migration 0009's ``loragate_apply_approval``, and the production pointer's trigger
checks that one was applied in the same transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, text, update
from sqlalchemy.engine import Connection

from loragate.registry.db.approvals import ApprovalRepository, Signer
from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import api_tokens, approval_codes, canary_windows
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.approvals import MIN_TTL_S, Decision, PresentedCode, issue_code
from loragate.registry.rules.canary import WindowStatus

# Postgres: migration 0009's function, the only way a role's user applies a code
_APPLY = text("SELECT loragate_apply_approval(:version_id, :code_id)")


class SignOffRepository:
    def __init__(self, db: Database, codes: ApprovalRepository):
        self.db = db
        self.codes = codes

    def apply(self, conn: Connection, version_id: str, at: datetime, code_id: str | None = None) -> str | None:
        """Consume a redeemed approve code for ``version_id`` (``code_id``, else the oldest)
        for a production move in this transaction; its id, or None when there is none. On
        Postgres through ``loragate_apply_approval``: the production pointer's trigger checks
        that a code was applied in the same transaction."""
        if not self.db.is_sqlite:
            return conn.execute(_APPLY, {"version_id": version_id, "code_id": code_id}).scalar()
        oldest = (
            select(
                approval_codes.c.code_id,
                approval_codes.c.used_at,
                approval_codes.c.issued_at,
                approval_codes.c.expires_at,
            )
            .join(api_tokens, api_tokens.c.token_id == approval_codes.c.token_id)
            .outerjoin(canary_windows, canary_windows.c.id == approval_codes.c.window_id)
            .where(
                approval_codes.c.version_id == version_id,
                approval_codes.c.decision == Decision.APPROVE.value,
                approval_codes.c.used_at.is_not(None),
                approval_codes.c.applied_at.is_(None),
                api_tokens.c.revoked_at.is_(None),
                or_(approval_codes.c.window_id.is_(None), canary_windows.c.status == WindowStatus.READY.value),
                *([approval_codes.c.code_id == code_id] if code_id else []),
            )
            .order_by(approval_codes.c.used_at, approval_codes.c.code_id)
        )
        # within its lifetime counted from its redemption (SQLite has no interval arithmetic)
        code_id = next(
            (
                row.code_id
                for row in conn.execute(oldest)
                if at < utc(row.used_at) + (utc(row.expires_at) - utc(row.issued_at))
            ),
            None,
        )
        if code_id is None:
            return None
        applied = conn.execute(
            update(approval_codes)
            .where(approval_codes.c.code_id == code_id, approval_codes.c.applied_at.is_(None))
            .values(applied_at=at)
        ).rowcount
        return code_id if applied == 1 else None

    def sign_off_pending(self, conn: Connection, window: Any) -> bool:
        """Whether a person's sign-off of ``window``'s version waits for the promotion to
        apply it: an approve code for the version, bound to this window or to none,
        redeemed, not applied, within its lifetime counted from its redemption, its
        reviewer's token active. What lets the promotion raise the window's share above the
        cap; migration 0012's trigger asks the same of the activation user on Postgres."""
        redeemed = (
            select(approval_codes.c.used_at, approval_codes.c.issued_at, approval_codes.c.expires_at)
            .join(api_tokens, api_tokens.c.token_id == approval_codes.c.token_id)
            .where(
                approval_codes.c.version_id == window.version_id,
                approval_codes.c.decision == Decision.APPROVE.value,
                or_(approval_codes.c.window_id.is_(None), approval_codes.c.window_id == window.id),
                approval_codes.c.used_at.is_not(None),
                approval_codes.c.applied_at.is_(None),
                api_tokens.c.revoked_at.is_(None),
            )
        )
        now = utcnow()
        return any(now < utc(r.used_at) + (utc(r.expires_at) - utc(r.issued_at)) for r in conn.execute(redeemed))

    def sign_off_in(self, conn: Connection, signer: Signer, name: str, version_id: str, at: datetime) -> str:
        """A person's own production move: an approve code issued to their token and used at
        once, in the move's transaction, so it goes through the same door as a sign-off
        given to the pipeline (on Postgres the database checks the token's secret). Its id.

        Raises:
            PermissionDenied: (Postgres) the database does not take the token.
        """
        issued = issue_code()
        self.codes.insert_code(conn, issued, signer, Decision.APPROVE, MIN_TTL_S, None, name, version_id, at)
        presented = PresentedCode.parse(issued.code)
        used = self.codes.use_code(conn, issued.code_id, presented.secret, f"promote by {signer[1]}", at)
        assert used is not None, "a code issued in this transaction is unused"
        return issued.code_id

    def sign_off_ahead(self, signer: Signer, name: str, version_id: str) -> str:
        """``sign_off_in`` in a transaction of its own, committed before the move that applies
        it (``service/approvals.py``: ``_sign_off_ahead``). Its id."""
        with self.db.write() as conn:
            return self.sign_off_in(conn, signer, name, version_id, utcnow())
