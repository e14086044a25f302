"""Decisions that prove who made them (``rules/approvals.py``): an approval code issued to
the caller's own activation token (a person's, never a pipeline's); a production sign-off
recorded only with a code that proves it, redeemed in the same transaction; a production
move that consumes one; a rollback started through the pipeline only with a code for the
version the stage serves, redeemed just before it moves."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import Connection

from loragate.registry.db.approvals import Signer
from loragate.registry.db.pointers import ClaimedAdapter
from loragate.registry.errors import (
    ApprovalRefused,
    ErrorCode,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
)
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.access import Action, TokenKind, TokenRecord
from loragate.registry.rules.approvals import ApprovalCode, Decision, PresentedCode, Redemption, check_ttl, issue_code
from loragate.registry.rules.canary import CanaryWindow, WindowStatus, override_required
from loragate.registry.rules.lifecycle import Plan, Pointer, ValidationStatus, check_scan_acknowledged
from loragate.registry.rules.text import check_text
from loragate.registry.service.validation import ValidationMixin

T = TypeVar("T")


class ApprovalMixin(ValidationMixin):
    def _code_holder(self, name: str) -> tuple[str, TokenRecord]:
        """(actor, token) of a caller who may be issued a code for ``name``.

        Raises:
            PermissionDenied: no activation token for the adapter (the owner has none).
        """
        actor = self._authorize(Action.APPROVE, name)
        token_id = self.principal.token_id
        found = self._store.access.token(token_id) if token_id is not None else None
        if found is None:
            raise PermissionDenied(
                f"{actor} holds no token: an approval code is issued to an activation token", field="LORAGATE_TOKEN"
            )
        if found[0].kind != TokenKind.PERSON:
            raise PermissionDenied(
                f"{actor} is a pipeline token: an approval code is issued only to a person's token, "
                "so the pipeline never approves its own move",
                field="LORAGATE_TOKEN",
            )
        return actor, found[0]

    def _own_signer(self) -> Signer | None:
        """A person's token signs off its own production move; the principal already holds
        what that needs. None for anyone else."""
        principal = self.principal
        if principal.kind == TokenKind.PERSON and principal.token_id is not None and principal.holder is not None:
            return (principal.token_id, principal.holder, principal.token_secret)
        return None

    def _sign_off_ahead(self, version_id: str, *, acknowledged: bool, override: bool = False) -> str | None:
        """A person's own move of production to ``version_id``: their sign-off committed in a
        transaction of its own before the move, so that a production replica which admits a
        version only by a pointer or a person's redeemed code (a fleet started without
        owner-moves) already sees it when the switch loads the version -- which it does before
        the move commits. Only for the adapter's canary, validated (production takes nothing
        else); the move decides again under the adapter's lock, and applies this code. The
        code id, else None (anyone but a person, a version production would not take).
        Left unapplied by a failed move, the code lapses after its short lifetime: that
        person signed the version off for production all the same.

        Raises:
            PermissionDenied: the caller may not promote this adapter, or (Postgres) the
                database does not take the token.
            IllegalTransition: SCAN_REVIEW_UNACKNOWLEDGED; OVERRIDE_REQUIRED, the version's
                window is still observing and ``override`` was not given.
        """
        signer = self._own_signer()
        if signer is None:
            return None
        version = self._store.versions.get(version_id)
        self.principal.require(Action.PROMOTE_PRODUCTION, version.name)
        pointers = self._store.pointers.adapter(version.name)
        if pointers.canary != version_id or version.validation_status != ValidationStatus.PASSED:
            return None
        if not override:  # refused before a code is signed; the move decides again under its lock
            still_open = self._store.canary.windows(statuses=(WindowStatus.OPEN,), version_id=version_id)
            if still_open:
                raise override_required(still_open[0].id, version_id)
        if not acknowledged:
            scan = self.scan_under_review(version_id)
            check_scan_acknowledged(version_id, scan.describe() if scan else None, acknowledged=False)
        return self._store.sign_offs.sign_off_ahead(signer, version.name, version_id)

    def _consume_sign_off(
        self, claim: ClaimedAdapter, plan: Plan, own_code: str | None = None
    ) -> dict[str, str] | None:
        """What lets ``plan`` move production to a new version, in its transaction: a person's
        token signs off itself (``own_code``, committed ahead by ``_sign_off_ahead``; if it
        lapsed meanwhile, a code issued to the token and used at once); anyone else's move
        applies a code a person redeemed for that version -- a pipeline token without one is
        refused. The registry's owner (in process, no token) needs none, unless the database
        says otherwise (Postgres: a role's user needs one, migration 0009). A rollback
        (production back to previous) needs none.

        Raises:
            PermissionDenied: APPROVAL_REQUIRED, a token's move with no person's sign-off.
        """
        moved_to = plan.pointer_changes.get(Pointer.PRODUCTION)
        if moved_to is None or plan.action != "promote":
            return None
        principal = self.principal
        signer = self._own_signer()

        def consume(conn: Connection) -> str | None:
            at = utcnow()
            applied = self._store.sign_offs.apply(conn, moved_to, at, code_id=own_code) if own_code else None
            if applied is None:
                own = self._store.sign_offs.sign_off_in(conn, signer, claim.name, moved_to, at) if signer else None
                applied = self._store.sign_offs.apply(conn, moved_to, at, code_id=own)
            return applied

        applied = claim.record(consume)
        if applied is None and principal.token_id is not None:
            raise PermissionDenied(
                f"{principal.actor} moves production to {moved_to} only on a person's sign-off: "
                f"`loragate approve-code {moved_to}` and the promote flow's form, or `loragate approve`",
                code=ErrorCode.APPROVAL_REQUIRED,
                field="approval",
            )
        return {"approval_code": applied} if applied else None

    def issue_approval_code(
        self, version_id: str, *, decision: Decision = Decision.APPROVE, ttl_s: float | None = None
    ) -> tuple[ApprovalCode, str]:
        """A single-use code issued to the caller's own activation token and its holder;
        returns (record, code). To approve or reject: bound to ``version_id``'s canary
        window, which must wait for a sign-off. To roll back: bound to ``version_id``, which
        production or the canary of its adapter must serve. Shown once: only its hash is
        stored.

        Raises:
            InvalidInput: INVALID_SETTING for a ttl outside 30 s .. 24 h.
            NotFound: no such version, or (approve, reject) it was never canaried.
            IllegalTransition: its window is not waiting for a sign-off; (rollback) no
                stage serves it.
            PermissionDenied: the caller holds no activation token for the adapter (a code
                is issued to a token: the registry's owner has none).
        """
        ttl = check_ttl(self.settings.approval_code_ttl_s if ttl_s is None else ttl_s)
        version = self._store.versions.get(version_id)
        actor, token = self._code_holder(version.name)
        issued = issue_code()
        if decision == Decision.ROLLBACK:
            adapter = self._store.pointers.adapter(version.name)
            serving = {adapter.production, adapter.canary}
            if version_id not in serving:
                raise IllegalTransition(
                    f"{version_id} is {version.stage.value}: neither production nor the canary serves it, "
                    "there is nothing to roll back",
                    field="version",
                )
            secret = self.principal.token_secret
            record = self._store.approvals.issue(
                issued, token, secret, decision, ttl, actor, rollback_of=(version.name, version_id)
            )
            return record, issued.code
        windows = self._store.canary.windows(version_id=version_id)
        if not windows:
            raise NotFound(f"{version_id} has never been canaried: there is no sign-off to give", field="version")
        record = self._store.approvals.issue(
            issued, token, self.principal.token_secret, decision, ttl, actor, window_id=windows[-1].id
        )
        return record, issued.code

    def approval_codes(self, window_id: int) -> list[ApprovalCode]:
        """The codes issued for a window's sign-off, oldest first (never their secrets)."""
        return self._store.approvals.codes(window_id)

    def record_approval(
        self,
        window_id: int,
        *,
        approve: bool,
        reviewer: str,
        code: str,
        comment: str = "",
        flow_run_id: str | None = None,
        acknowledge_scan_review: bool = False,
    ) -> CanaryWindow:
        """The sign-off decision, recorded only when ``code`` proves it: issued for this
        window and decision to ``reviewer``'s still-active token (not the caller's own),
        unexpired and unused -- it is used now. An approval of a version whose weight scan
        asked for review must acknowledge it. The audit event names the token. A rejection
        closes the window. A refusal records nothing but the audit log, and spends the code
        when it was presented with its secret: a code presented is a code spent, so a form
        read back from the orchestrator, corrected and sent again, proves nothing.

        Raises:
            InvalidInput: INVALID_NAME for an empty reviewer; INVALID_TEXT for a reviewer or
                comment that is not one line of printable text.
            NotFound: no such window.
            IllegalTransition: the window is not waiting for a sign-off.
            PermissionDenied: the caller may not record sign-offs for the adapter.
            ApprovalRefused: the code does not prove the decision (its error code says why).
            IllegalTransition: SCAN_REVIEW_UNACKNOWLEDGED, an approval that does not
                acknowledge the weight scan's review (the code is spent).
        """
        if not reviewer.strip():
            raise InvalidInput("a decision needs a reviewer", code=ErrorCode.INVALID_NAME, field="reviewer")
        check_text(reviewer, field="reviewer")
        check_text(comment, field="comment", limit=None)
        window = self._store.canary.window(window_id)
        actor = self._authorize(Action.APPROVE, window.adapter_name)
        decision = Decision.of(approve)
        offer = Redemption(window_id, window.version_id, decision, reviewer.strip(), self.principal.token_id, utcnow())
        scan = self.scan_under_review(window.version_id) if approve else None
        return self._redeeming(
            code,
            offer,
            window.adapter_name,
            actor,
            lambda presented: self._store.approvals.record_decision(
                presented, offer, comment=comment, flow_run_id=flow_run_id, actor=actor
            ),
            before=lambda: check_scan_acknowledged(
                window.version_id, scan.describe() if scan else None, acknowledged=acknowledge_scan_review
            ),
        )

    def redeem_rollback_code(
        self, name: str, stage: str, code: str, *, expected_version: str | None = None, used_by: str
    ) -> ApprovalCode | None:
        """Use ``code`` to start a rollback of ``stage`` of ``name``: it must be a rollback
        code for the version the stage serves now, issued to a still-active activation token
        (not the caller's own). Returns the redeemed code (who approved, with which token);
        None, with the code untouched, when the stage no longer serves ``expected_version``
        (a rollback already made needs no code). A refusal changes nothing but the audit log.

        Raises:
            InvalidInput: ILLEGAL_TRANSITION for a stage that is not canary or production.
            NotFound: no such adapter.
            IllegalTransition: the stage serves nothing.
            PermissionDenied: the caller may not roll the adapter back.
            ApprovalRefused: the code does not prove this rollback.
        """
        if stage not in (Pointer.PRODUCTION.value, Pointer.CANARY.value):
            raise InvalidInput(
                f"--stage must be canary or production, not {stage!r}", code=ErrorCode.ILLEGAL_TRANSITION, field="stage"
            )
        adapter = self._store.pointers.adapter(name)
        production = stage == Pointer.PRODUCTION.value
        actor = self._authorize(Action.ROLLBACK_PRODUCTION if production else Action.WITHDRAW_CANARY, name)
        current = adapter.production if production else adapter.canary
        if expected_version is not None and current != expected_version:
            return None
        if current is None:
            raise IllegalTransition(f"{name} has no {stage} version: there is nothing to roll back", field="stage")
        offer = Redemption(None, current, Decision.ROLLBACK, None, self.principal.token_id, utcnow())
        return self._redeeming(
            code,
            offer,
            name,
            actor,
            lambda presented: self._store.approvals.redeem_rollback(
                presented, offer, name, stage, used_by=used_by, actor=actor
            ),
        )

    def _redeeming(
        self,
        code: str,
        offer: Redemption,
        name: str,
        actor: str,
        redeem: Callable[[PresentedCode], T],
        before: Callable[[], None] | None = None,
    ) -> T:
        """``redeem(PresentedCode)`` once ``before()`` (a rule of the decision itself) holds;
        a refusal of either is audited, the code presented is spent, and the refusal raised
        as it was."""
        presented: PresentedCode | None = None
        try:
            presented = PresentedCode.parse(code)
            if before is not None:
                before()
            return redeem(presented)
        except (ApprovalRefused, IllegalTransition) as refused:
            if presented is not None:
                self._store.approvals.spend(presented.code_id, presented.secret, f"refused: {refused.code.value}")
            if isinstance(refused, ApprovalRefused):
                self._store.approvals.record_refusal(
                    refused, presented.code_id if presented else None, offer, name, actor
                )
            raise
