"""Sign-offs as the registry keeps them: approval codes issued to activation tokens, and
the decision a code proves, recorded with it in one transaction.

Redeeming a code reads its row under a row lock, checks every rule
(``rules/approvals.check_redeemable``) and marks it used with a compare-and-set on
``used_at IS NULL``: of two resumes racing with one code, exactly one records a decision.
The decision's audit event names the token that proved it; a refusal changes nothing and
is audited on its own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from registry.db.canary import CanaryRepository, window_from_row
from registry.db.database import Database, utc, utc_or_none
from registry.db.schema import api_tokens, approval_codes
from registry.errors import ApprovalRefused, ErrorCode, IllegalTransition
from registry.records.adapters import utcnow
from registry.rules.access import TokenRecord
from registry.rules.approvals import ApprovalCode, Decision, IssuedCode, PresentedCode, Redemption, check_redeemable
from registry.rules.canary import CanaryWindow, WindowStatus


def code_from_row(row: Any) -> ApprovalCode:
    return ApprovalCode(
        code_id=row.code_id,
        secret_hash=row.secret_sha256,
        window_id=row.window_id,
        version_id=row.version_id,
        adapter_name=row.adapter_name,
        token_id=row.token_id,
        reviewer=row.reviewer,
        decision=Decision(row.decision),
        issued_at=utc(row.issued_at),
        expires_at=utc(row.expires_at),
        used_at=utc_or_none(row.used_at),
        used_by=row.used_by,
    )


class ApprovalRepository:
    def __init__(self, db: Database, canary: CanaryRepository):
        self.db = db
        self.canary = canary

    def _ready_window(self, conn: Connection, window_id: int) -> Any:
        row = self.canary.window_row(conn, window_id)
        if row.status != WindowStatus.READY.value:
            raise IllegalTransition(
                f"canary window {window_id} of {row.version_id} is {row.status}, not waiting for a sign-off",
                field="version_id",
            )
        return row

    def issue(
        self, issued: IssuedCode, window_id: int, token: TokenRecord, decision: Decision, ttl_s: float, actor: str
    ) -> ApprovalCode:
        """Store a code for the window's sign-off, bound to ``token`` and its holder.

        Raises:
            NotFound: no such window.
            IllegalTransition: the window is not waiting for a sign-off.
        """
        now = utcnow()
        with self.db.write() as conn:
            window = self._ready_window(conn, window_id)
            conn.execute(
                insert(approval_codes).values(
                    code_id=issued.code_id,
                    secret_sha256=issued.secret_hash,
                    window_id=window_id,
                    version_id=window.version_id,
                    adapter_name=window.adapter_name,
                    token_id=token.token_id,
                    reviewer=token.holder,
                    decision=decision.value,
                    issued_at=now,
                    expires_at=now + timedelta(seconds=ttl_s),
                )
            )
            self.db.audit(
                conn,
                actor=actor,
                action="approval_code_issued",
                adapter_name=window.adapter_name,
                version_id=window.version_id,
                stage="production",
                to_value=issued.code_id,
                at=now,
                details={
                    "window_id": window_id,
                    "decision": decision.value,
                    "token_id": token.token_id,
                    "ttl_s": ttl_s,
                },
            )
            row = conn.execute(select(approval_codes).where(approval_codes.c.code_id == issued.code_id)).one()
        return code_from_row(row)

    def codes(self, window_id: int) -> list[ApprovalCode]:
        with self.db.reader.connect() as conn:
            rows = conn.execute(
                select(approval_codes)
                .where(approval_codes.c.window_id == window_id)
                .order_by(approval_codes.c.issued_at)
            )
            return [code_from_row(r) for r in rows]

    def record_decision(
        self, presented: PresentedCode, offer: Redemption, *, comment: str, flow_run_id: str | None, actor: str
    ) -> CanaryWindow:
        """Redeem ``presented`` for ``offer`` and record the decision with it; a rejection
        closes the window. Nothing is written when the code does not prove the offer.

        Raises:
            NotFound: no such window.
            IllegalTransition: the window is not waiting for a sign-off.
            ApprovalRefused: the code does not prove this decision (its code says why).
        """
        with self.db.write() as conn:
            window = self._ready_window(conn, offer.window_id)
            row = conn.execute(
                select(approval_codes).where(approval_codes.c.code_id == presented.code_id).with_for_update()
            ).first()
            stored = code_from_row(row) if row is not None else None
            token_active = stored is not None and (
                conn.execute(
                    select(api_tokens.c.revoked_at).where(api_tokens.c.token_id == stored.token_id)
                ).scalar_one_or_none()
                is None
            )
            check_redeemable(stored, presented, offer, token_active=token_active)
            assert stored is not None  # check_redeemable refuses an unknown code
            used = conn.execute(
                update(approval_codes)
                .where(approval_codes.c.code_id == stored.code_id, approval_codes.c.used_at.is_(None))
                .values(used_at=offer.at, used_by=(flow_run_id or actor)[:128])
            ).rowcount
            if used != 1:
                raise ApprovalRefused(
                    f"approval code {stored.code_id} was used meanwhile",
                    code=ErrorCode.APPROVAL_CODE_USED,
                    field="code",
                )
            approve = offer.decision == Decision.APPROVE
            self.db.audit(
                conn,
                actor=actor,
                action="approval",
                adapter_name=window.adapter_name,
                version_id=window.version_id,
                stage="production",
                to_value="approved" if approve else "rejected",
                reason=comment or None,
                at=offer.at,
                details={
                    "window_id": offer.window_id,
                    "approve": approve,
                    "reviewer": offer.reviewer,
                    "comment": comment,
                    "flow_run_id": flow_run_id,
                    "token_id": stored.token_id,
                    "approval_code": stored.code_id,
                },
            )
            if not approve:
                why = f"rejected by {offer.reviewer}: {comment}"
                self.canary.move_in(conn, window, WindowStatus.REJECTED, why, actor, offer.at)
            return window_from_row(self.canary.window_row(conn, offer.window_id))

    def record_refusal(self, refused: ApprovalRefused, presented_id: str | None, offer: Redemption, actor: str) -> None:
        """A sign-off refused, in the audit log (nothing else changes)."""
        with self.db.write() as conn:
            window = self.canary.window_row(conn, offer.window_id)
            self.db.audit(
                conn,
                actor=actor,
                action="approval_refused",
                adapter_name=window.adapter_name,
                version_id=window.version_id,
                stage="production",
                to_value=refused.code.value,
                reason=refused.message,
                at=offer.at,
                details={
                    "window_id": offer.window_id,
                    "approval_code": presented_id,
                    "reviewer": offer.reviewer,
                    "decision": offer.decision.value,
                },
            )
