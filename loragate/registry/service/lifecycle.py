"""Moving pointers: promote to canary or production, roll back -- each one pointer move.

The registry offers the move, not a promotion that leaves replicas behind: the one caller
is the fleet switch (``loragate.tasks.fleet``), where a move reads top to bottom::

    with (
        attempt,                                             # again after a lost compare-and-set
        FleetSwitch(registry, name, copies) as switch,      # puts every replica back on an error
        registry.pointer_move(version_id, "production", reason=...) as move,
    ):
        switch.apply(move.plan)          # under the adapter's lock, the move written, not committed
        move.audit(switch.report())      # in the move's own transaction
    # committed here; an error anywhere above rolls everything back

Entering claims the adapter's row, authorizes the caller for it, plans from the pointers
read under that lock, verifies every version the plan points at (its stored bytes; for
production its signature and any weight-scan acknowledgement), consumes the person's
sign-off a move to production needs (``service/approvals.py``) and writes the plan. The
block runs under the same lock; leaving it commits the move, its audit and whatever the
block audited, together -- the log never shows a move without its replicas, nor the
reverse. A caller that changed something outside the database (replicas) undoes it when
the ``with`` raises.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.registry.db.pointers import ClaimedAdapter
from loragate.registry.digests import digest_of_hex
from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.rules.access import Action
from loragate.registry.rules.lifecycle import Plan, Pointer, check_scan_acknowledged, plan_promotion, plan_rollback
from loragate.registry.rules.names import AdapterName
from loragate.registry.rules.text import check_text
from loragate.registry.service.approvals import ApprovalMixin
from loragate.registry.service.signing import SigningMixin
from loragate.registry.service.validation import ValidationMixin

# what a switch did to the replicas is audited under this action, in the move's transaction
DEPLOY_ACTION = "deploy"


@dataclass
class PointerMove:
    """A pointer move in progress: the plan, made and verified under the adapter's lock."""

    plan: Plan
    name: str
    actor: str
    reason: str | None
    _claim: ClaimedAdapter

    @property
    def pointers(self) -> dict[Pointer, str]:
        """The adapter's pointers before this move, as read under the lock."""
        return dict(self._claim.pointers)

    def audit(self, fleet_entries: list[dict[str, Any]]) -> None:
        """One audit event per replica the move switched, committed with the move."""
        self._claim.audit(self.actor, DEPLOY_ACTION, fleet_entries, self.reason)


def _pointer(value: str, field: str) -> Pointer:
    try:
        return Pointer(value)
    except ValueError as e:
        flag = "--to" if field == "to" else "--stage"
        raise InvalidInput(
            f"{flag} must be canary or production, not {value!r}", code=ErrorCode.ILLEGAL_TRANSITION, field=field
        ) from e


class LifecycleMixin(ApprovalMixin, SigningMixin, ValidationMixin):
    @contextmanager
    def pointer_move(
        self,
        version_id: str,
        to: str,
        *,
        reason: str | None = None,
        acknowledge_scan_review: bool = False,
        copies: Mapping[str, Path] | None = None,
    ) -> Iterator[PointerMove]:
        """Move the canary or production pointer to ``version_id`` (already there: an empty
        plan, and nothing is written). A version whose weight scan asked for review reaches
        production only with ``acknowledge_scan_review``, which the audit log records.
        ``copies``: local copies of versions' bundles (version -> directory, a replica's,
        made before the lock) that the production signature is verified on instead of the
        stored blobs fetched under the lock -- the same bytes, as the blobs are checked
        against the same digests.

        Raises:
            InvalidInput: ILLEGAL_TRANSITION for a target that is not canary or production;
                INVALID_TEXT for a reason that is not one line of printable text.
            IllegalTransition: the lifecycle forbids the move (VALIDATION_REQUIRED;
                SCAN_REVIEW_UNACKNOWLEDGED for production under scan review unacknowledged).
            NotFound: no such version.
            PermissionDenied: the caller may not move this adapter's pointer; APPROVAL_REQUIRED,
                a token's move to production with no person's sign-off to consume.
            IntegrityFailure: ARTIFACT_CORRUPTED, a blob of the version is missing or damaged.
            SignatureInvalid: production without a valid signature.
        """
        target = _pointer(to, "to")
        check_text(reason, field="reason")
        action = Action.PROMOTE_PRODUCTION if target == Pointer.PRODUCTION else Action.PROMOTE_CANARY
        principal = self.principal
        if target == Pointer.PRODUCTION and acknowledge_scan_review and self.scan_under_review(version_id):
            reason = f"{reason}; weight-scan review acknowledged" if reason else "weight-scan review acknowledged"
        own_code = (
            self._sign_off_ahead(version_id, acknowledged=acknowledge_scan_review)
            if target == Pointer.PRODUCTION
            else None
        )
        with self._store.pointers.claim(subject=version_id) as claim:
            principal.require(action, claim.name)  # a denial rolls the claim back: nothing changed
            plan = plan_promotion(claim.pointers, claim.states[version_id], target, claim.states)
            self._verify_targets(plan, claim, acknowledge_scan_review, copies)
            sign_off = self._consume_sign_off(claim, plan, own_code)
            claim.apply(plan, actor=principal.actor, reason=reason, details=sign_off)
            yield PointerMove(plan, claim.name, principal.actor, reason, claim)

    @contextmanager
    def rollback_move(
        self,
        name: str,
        stage: str = "production",
        *,
        reason: str | None = None,
        expected_version: str | None = None,
        copies: Mapping[str, Path] | None = None,
    ) -> Iterator[PointerMove]:
        """Production back to ``previous`` in one pointer move, or withdraw the canary; the
        version production returns to has its stored bytes and signature verified first
        (the signature on its copy in ``copies``, as ``pointer_move``).
        With ``expected_version``, only if the stage still serves it, as read under the
        adapter's lock: a decision made on a version the stage has moved on from (a canary
        replaced, a promotion landed) is an empty plan, and writes nothing.

        Raises:
            InvalidInput: ILLEGAL_TRANSITION for a stage that is not canary or production;
                INVALID_TEXT for a reason that is not one line of printable text.
            IllegalTransition: nothing to roll back, or no previous production.
            NotFound: no such adapter.
            PermissionDenied: the caller may not roll this adapter back.
            IntegrityFailure: ARTIFACT_CORRUPTED, a blob of the previous version is damaged.
        """
        AdapterName.parse(name)
        target = _pointer(stage, "stage")
        check_text(reason, field="reason")
        actor = self._authorize(
            Action.ROLLBACK_PRODUCTION if target == Pointer.PRODUCTION else Action.WITHDRAW_CANARY, name
        )
        with self._store.pointers.claim(name=name) as claim:
            if expected_version is not None and claim.pointers.get(target) != expected_version:
                yield PointerMove(Plan(action="rollback"), claim.name, actor, reason, claim)
                return
            plan = plan_rollback(claim.pointers, target, claim.states, name)
            self._verify_targets(plan, claim, acknowledged=True, copies=copies)
            claim.apply(plan, actor=actor, reason=reason)
            yield PointerMove(plan, claim.name, actor, reason, claim)

    def _verify_targets(
        self, plan: Plan, claim: ClaimedAdapter, acknowledged: bool, copies: Mapping[str, Path] | None = None
    ) -> None:
        """Every version the plan points at: its stored bytes; for production, the signature
        production relies on (promotion and rollback alike) and the scan acknowledgement."""
        for pointer, version_id in plan.targets():
            for hexdigest in claim.blobs[version_id]:
                self._artifacts.verify(digest_of_hex(hexdigest))
            if pointer == Pointer.PRODUCTION:
                self.verify_signature(version_id, bundle_dir=(copies or {}).get(version_id))
                if not acknowledged:
                    scan = self.scan_under_review(version_id)
                    check_scan_acknowledged(version_id, scan.describe() if scan else None, acknowledged=False)
