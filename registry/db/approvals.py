"""Sign-offs as the registry keeps them: approval codes issued to activation tokens, and
the decision a code proves, recorded with it in one transaction (a rollback's code is
redeemed on its own, just before the rollback moves anything).

Redeeming a code reads its row under a row lock, checks every rule
(``rules/approvals.check_redeemable``) and marks it used with a compare-and-set on
``used_at IS NULL``: of two resumes racing with one code, exactly one records a decision.
The decision's audit event names the token that proved it; a refusal changes nothing and
is audited on its own.
"""

from __future__ import annotations

import dataclasses
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
        self,
        issued: IssuedCode,
        token: TokenRecord,
        decision: Decision,
        ttl_s: float,
        actor: str,
        *,
        window_id: int | None = None,
        rollback_of: tuple[str, str] | None = None,
    ) -> ApprovalCode:
        """Store a code bound to ``token`` and its holder: for the sign-off of ``window_id``,
        or for rolling back ``rollback_of`` (adapter name, version the stage serves).

        Raises:
            NotFound: no such window.
            IllegalTransition: the window is not waiting for a sign-off.
        """
        now = utcnow()
        with self.db.write() as conn:
            if window_id is not None:
                window = self._ready_window(conn, window_id)
                name, version_id = window.adapter_name, window.version_id
            else:
                assert rollback_of is not None, "a code decides on a window or on a version to roll back"
                name, version_id = rollback_of
            conn.execute(
                insert(approval_codes).values(
                    code_id=issued.code_id,
                    secret_sha256=issued.secret_hash,
                    window_id=window_id,
                    version_id=version_id,
                    adapter_name=name,
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
                adapter_name=name,
                version_id=version_id,
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

    def _redeem(self, conn: Connection, presented: PresentedCode, offer: Redemption, *, used_by: str) -> ApprovalCode:
        """Check ``presented`` against ``offer`` under its row lock and mark it used (a
        compare-and-set: of two racing redemptions one wins, the other is refused).

        Raises:
            ApprovalRefused: the code does not prove the offer, or was used meanwhile.
        """
        row = conn.execute(
            select(approval_codes).where(approval_codes.c.code_id == presented.code_id).with_for_update()
        ).first()
        stored = code_from_row(row) if row is not None else None
        token_active = stored is not None and (
            conn.execute(select(api_tokens.c.revoked_at).where(api_tokens.c.token_id == stored.token_id)).scalar()
            is None
        )
        check_redeemable(stored, presented, offer, token_active=token_active)
        assert stored is not None  # check_redeemable refuses an unknown code
        used = conn.execute(
            update(approval_codes)
            .where(approval_codes.c.code_id == stored.code_id, approval_codes.c.used_at.is_(None))
            .values(used_at=offer.at, used_by=used_by[:128])
        ).rowcount
        if used != 1:
            raise ApprovalRefused(
                f"approval code {stored.code_id} was used meanwhile", code=ErrorCode.APPROVAL_CODE_USED, field="code"
            )
        return dataclasses.replace(stored, used_at=offer.at, used_by=used_by[:128])

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
        assert offer.window_id is not None, "a sign-off decides on a window"
        with self.db.write() as conn:
            window = self._ready_window(conn, offer.window_id)
            stored = self._redeem(conn, presented, offer, used_by=flow_run_id or actor)
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
                    "reviewer": stored.reviewer,
                    "comment": comment,
                    "flow_run_id": flow_run_id,
                    "token_id": stored.token_id,
                    "approval_code": stored.code_id,
                },
            )
            if not approve:
                why = f"rejected by {stored.reviewer}: {comment}"
                self.canary.move_in(conn, window, WindowStatus.REJECTED, why, actor, offer.at)
            return window_from_row(self.canary.window_row(conn, offer.window_id))

    def redeem_rollback(
        self, presented: PresentedCode, offer: Redemption, name: str, stage: str, *, used_by: str, actor: str
    ) -> ApprovalCode:
        """Redeem ``presented`` for rolling ``stage`` of ``name`` back from ``offer``'s
        version, audited as a ``rollback_approval`` naming the token that proved it.

        Raises:
            ApprovalRefused: the code does not prove the rollback.
        """
        with self.db.write() as conn:
            stored = self._redeem(conn, presented, offer, used_by=used_by)
            self.db.audit(
                conn,
                actor=actor,
                action="rollback_approval",
                adapter_name=name,
                version_id=offer.version_id,
                stage=stage,
                to_value="rollback",
                at=offer.at,
                details={"reviewer": stored.reviewer, "token_id": stored.token_id, "approval_code": stored.code_id},
            )
        return stored

    def record_refusal(
        self, refused: ApprovalRefused, presented_id: str | None, offer: Redemption, name: str, actor: str
    ) -> None:
        """A sign-off or a rollback refused, in the audit log (nothing else changes)."""
        with self.db.write() as conn:
            self.db.audit(
                conn,
                actor=actor,
                action="approval_refused",
                adapter_name=name,
                version_id=offer.version_id,
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
