"""Sign-offs as the registry keeps them: approval codes issued to activation tokens, and
the decision a code proves, recorded with it in one transaction (a rollback's code is
redeemed on its own, just before the rollback moves anything).

Redeeming a code reads its row, checks every rule (``rules/approvals.check_redeemable``)
and marks it used with a compare-and-set on ``used_at IS NULL``: of two resumes racing with
one code, exactly one records a decision. (No row lock: a role's user holds no UPDATE
grant on codes since 0009, and the compare-and-set decides anyway.)
The decision's audit event names the token that proved it; a refusal changes nothing and
is audited on its own. A production move then applies (consumes) one redeemed approve code
for its version (``db/sign_offs.py``). On Postgres codes are issued, used and applied only
through migration 0009's functions, which check the secrets themselves.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import Connection

from loragate.registry.db.canary import CanaryRepository, window_from_row
from loragate.registry.db.database import Database, utc, utc_or_none
from loragate.registry.db.schema import api_tokens, approval_codes
from loragate.registry.errors import ApprovalRefused, ErrorCode, IllegalTransition
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.access import TokenRecord, hash_secret
from loragate.registry.rules.approvals import (
    ApprovalCode,
    Decision,
    IssuedCode,
    PresentedCode,
    Redemption,
    check_redeemable,
)
from loragate.registry.rules.canary import CanaryWindow, WindowStatus

# Postgres: the functions of migration 0009, the only way a role's user writes a code
_ISSUE = text(
    "SELECT loragate_issue_approval_code(:code_id, :secret_sha256, :window_id, :version_id, :adapter_name, "
    ":decision, :ttl_s, :token_id, :token_secret)"
)
_USE = text("SELECT loragate_use_approval_code(:code_id, :secret, :used_by)")
_SPEND = text("SELECT loragate_spend_approval_code(:code_id, :secret, :spent_by)")
# who a code is issued to: (token id, the token's holder, the token's secret)
Signer = tuple[str, str, str | None]


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
        token_secret: str | None,
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
            PermissionDenied: (Postgres) the database does not take ``token_secret`` as a
                person's active activation token.
        """
        now = utcnow()
        with self.db.write() as conn:
            if window_id is not None:
                window = self._ready_window(conn, window_id)
                name, version_id = window.adapter_name, window.version_id
            else:
                assert rollback_of is not None, "a code decides on a window or on a version to roll back"
                name, version_id = rollback_of
            signer = (token.token_id, token.holder, token_secret)
            self.insert_code(conn, issued, signer, decision, ttl_s, window_id, name, version_id, now)
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

    def insert_code(
        self,
        conn: Connection,
        issued: IssuedCode,
        signer: Signer,
        decision: Decision,
        ttl_s: float,
        window_id: int | None,
        name: str,
        version_id: str,
        now: datetime,
    ) -> None:
        """Store a code issued to ``signer``. On Postgres through
        ``loragate_issue_approval_code``, which checks the token's secret itself: a role's
        database user cannot insert a code (migration 0009)."""
        token_id, reviewer, token_secret = signer
        if self.db.is_sqlite:
            conn.execute(
                insert(approval_codes).values(
                    code_id=issued.code_id,
                    secret_sha256=issued.secret_hash,
                    window_id=window_id,
                    version_id=version_id,
                    adapter_name=name,
                    token_id=token_id,
                    reviewer=reviewer,
                    decision=decision.value,
                    issued_at=now,
                    expires_at=now + timedelta(seconds=ttl_s),
                )
            )
            return
        conn.execute(
            _ISSUE,
            {
                "code_id": issued.code_id,
                "secret_sha256": issued.secret_hash,
                "window_id": window_id,
                "version_id": version_id,
                "adapter_name": name,
                "decision": decision.value,
                "ttl_s": ttl_s,
                "token_id": token_id,
                "token_secret": token_secret or "",
            },
        )

    def use_code(self, conn: Connection, code_id: str, secret: str, used_by: str, at: datetime) -> datetime | None:
        """Mark a code used, once (compare-and-set on ``used_at IS NULL``); when it was used,
        or None when it was used meanwhile. On Postgres through
        ``loragate_use_approval_code``, which checks the code's secret again itself."""
        if not self.db.is_sqlite:
            used_at = conn.execute(_USE, {"code_id": code_id, "secret": secret, "used_by": used_by[:128]}).scalar()
            return utc_or_none(used_at)
        used = conn.execute(
            update(approval_codes)
            .where(approval_codes.c.code_id == code_id, approval_codes.c.used_at.is_(None))
            .values(used_at=at, used_by=used_by[:128])
        ).rowcount
        return at if used == 1 else None

    def spend(self, code_id: str, secret: str, spent_by: str) -> bool:
        """A code presented with its secret and refused, still unused: used and applied by no
        move, so the secret redeems nothing afterwards (whoever read it from the
        orchestrator's stored input included). True when it was spent now. On Postgres
        through ``loragate_spend_approval_code``, which checks the secret itself."""
        with self.db.write() as conn:
            if not self.db.is_sqlite:
                return bool(
                    conn.execute(_SPEND, {"code_id": code_id, "secret": secret, "spent_by": spent_by[:128]}).scalar()
                )
            at = utcnow()
            return (
                conn.execute(
                    update(approval_codes)
                    .where(
                        approval_codes.c.code_id == code_id,
                        approval_codes.c.used_at.is_(None),
                        approval_codes.c.secret_sha256 == hash_secret(secret),
                    )
                    .values(used_at=at, used_by=spent_by[:128], applied_at=at)
                ).rowcount
                == 1
            )

    def codes(self, window_id: int) -> list[ApprovalCode]:
        with self.db.reader.connect() as conn:
            rows = conn.execute(
                select(approval_codes)
                .where(approval_codes.c.window_id == window_id)
                .order_by(approval_codes.c.issued_at)
            )
            return [code_from_row(r) for r in rows]

    def _redeem(self, conn: Connection, presented: PresentedCode, offer: Redemption, *, used_by: str) -> ApprovalCode:
        """Check ``presented`` against ``offer`` and mark it used (a compare-and-set: of two
        racing redemptions one wins, the other is refused).

        Raises:
            ApprovalRefused: the code does not prove the offer, or was used meanwhile.
        """
        row = conn.execute(select(approval_codes).where(approval_codes.c.code_id == presented.code_id)).first()
        stored = code_from_row(row) if row is not None else None
        token_active = stored is not None and (
            conn.execute(select(api_tokens.c.revoked_at).where(api_tokens.c.token_id == stored.token_id)).scalar()
            is None
        )
        check_redeemable(stored, presented, offer, token_active=token_active)
        assert stored is not None  # check_redeemable refuses an unknown code
        used_at = self.use_code(conn, stored.code_id, presented.secret, used_by, offer.at)
        if used_at is None:
            raise ApprovalRefused(
                f"approval code {stored.code_id} was used meanwhile", code=ErrorCode.APPROVAL_CODE_USED, field="code"
            )
        return dataclasses.replace(stored, used_at=used_at, used_by=used_by[:128])

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
