"""Moving pointers: promote to canary or production, roll back -- each one pointer move.

The registry offers the move only together with the replicas it moves: ``pointer_move``
and ``rollback_move`` take a ``ReplicaSwitch`` (required; without one the call is a
``TypeError``) and run it themselves. The product's one switch is the fleet's
(``loragate.tasks.fleet.FleetSwitch``), where a move reads::

    with registry.pointer_move(version_id, "production", switch=FleetSwitch(...), reason=...):
        pass  # entering switched the replicas under the adapter's lock; leaving commits

Entering claims the adapter's row, authorizes the caller for it, plans from the pointers
read under that lock, verifies every version the plan points at (its stored bytes; for
production its signature and any weight-scan acknowledgement), consumes the person's
sign-off a move to production needs (``service/approvals.py``) and writes the plan -- all of
it again after a lost compare-and-set, before anything is switched. Then, under the same
lock, the switch applies the plan to the replicas and the move audits the switch's report
in its own transaction. The block runs under the lock too; leaving it commits the move,
its audit and whatever the block audited, together -- the log never shows a move without
its replicas, nor the reverse.

**The one undo.** A move that does not commit -- refused, its switch failed, its block
raised, its commit failed -- calls ``switch.revert()`` exactly once, here, after its
transaction has ended (what a revert puts back may write the registry, which the move's
own lock would block). Tests and benchmarks of the move itself, with no replicas, pass the
named seam ``NO_REPLICAS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from loragate.registry.db.pointers import ClaimedAdapter
from loragate.registry.digests import digest_of_hex
from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.retrying import tolerating_concurrent_updates
from loragate.registry.rules.access import Action
from loragate.registry.rules.lifecycle import Plan, Pointer, check_scan_acknowledged, plan_promotion, plan_rollback
from loragate.registry.rules.names import AdapterName
from loragate.registry.rules.text import check_text
from loragate.registry.service.approvals import ApprovalMixin
from loragate.registry.service.signing import SigningMixin
from loragate.registry.service.validation import ValidationMixin

# what a switch did to the replicas is audited under this action, in the move's transaction
DEPLOY_ACTION = "deploy"


@runtime_checkable
class ReplicaSwitch(Protocol):
    """The replicas' half of a pointer move, which the move runs itself."""

    def apply(self, plan: Plan) -> list[dict[str, Any]]:
        """Make the replicas serve what ``plan`` wants, under the adapter's lock, before the
        move commits. All or nothing: raising, it has put back what it changed, still under
        the lock, so no other move switches those replicas meanwhile. Returns one audit entry
        per replica action, which the move commits with itself."""
        ...

    def revert(self) -> None:
        """Put back what ``apply`` changed and anything else this switch was given to undo;
        called by the move, once, when it does not commit (``apply`` may not have run)."""
        ...


@dataclass(frozen=True)
class _NoReplicas:
    def apply(self, plan: Plan) -> list[dict[str, Any]]:
        return []

    def revert(self) -> None:
        return None


# the test seam: the switch of a registry with no replicas, applying and reverting nothing,
# for the move's own tests and the registry benchmark; the product moves through the fleet's
NO_REPLICAS: ReplicaSwitch = _NoReplicas()


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
        switch: ReplicaSwitch,
        reason: str | None = None,
        acknowledge_scan_review: bool = False,
        copies: Mapping[str, Path] | None = None,
        override: bool = False,
    ) -> Iterator[PointerMove]:
        """Move the canary or production pointer to ``version_id`` and ``switch`` the
        replicas with it (already there: an empty plan, and nothing is written). A version
        whose weight scan asked for review reaches production only with
        ``acknowledge_scan_review``, which the audit log records; a canary whose window is
        still observing only with ``override`` and a ``reason`` (the audit records both, and
        the window ends ``superseded`` with the reason). ``copies``: local copies of
        versions' bundles (version -> directory, a replica's, made before the lock) that the
        production signature is verified on instead of the stored blobs fetched under the
        lock -- the same bytes, as the blobs are checked against the same digests. Any of
        the errors below, or the switch's own, reverts the switch (once) and moves nothing.

        Raises:
            TypeError: ``switch`` is not a ``ReplicaSwitch``.
            InvalidInput: ILLEGAL_TRANSITION for a target that is not canary or production;
                INVALID_TEXT for a reason that is not one line of printable text; an
                ``override`` without a reason (field ``reason``).
            IllegalTransition: the lifecycle forbids the move (VALIDATION_REQUIRED;
                SCAN_REVIEW_UNACKNOWLEDGED for production under scan review unacknowledged;
                OVERRIDE_REQUIRED for production past a window still observing).
            NotFound: no such version.
            PermissionDenied: the caller may not move this adapter's pointer; APPROVAL_REQUIRED,
                a token's move to production with no person's sign-off to consume.
            IntegrityFailure: ARTIFACT_CORRUPTED, a blob of the version is missing or damaged.
            SignatureInvalid: production without a valid signature.
        """
        planned = partial(self._planned_promotion, version_id, to, reason, acknowledge_scan_review, copies, override)
        with self._with_replicas(switch, planned) as move:
            yield move

    @contextmanager
    def rollback_move(
        self,
        name: str,
        stage: str = "production",
        *,
        switch: ReplicaSwitch,
        reason: str | None = None,
        expected_version: str | None = None,
        copies: Mapping[str, Path] | None = None,
    ) -> Iterator[PointerMove]:
        """Production back to ``previous`` in one pointer move, or withdraw the canary, and
        ``switch`` the replicas with it; the version production returns to has its stored
        bytes and signature verified first (the signature on its copy in ``copies``, as
        ``pointer_move``). With ``expected_version``, only if the stage still serves it, as
        read under the adapter's lock: a decision made on a version the stage has moved on
        from (a canary replaced, a promotion landed) is an empty plan, and writes nothing.
        Any of the errors below, or the switch's own, reverts the switch (once) and moves
        nothing.

        Raises:
            TypeError: ``switch`` is not a ``ReplicaSwitch``.
            InvalidInput: ILLEGAL_TRANSITION for a stage that is not canary or production;
                INVALID_TEXT for a reason that is not one line of printable text.
            IllegalTransition: nothing to roll back, or no previous production.
            NotFound: no such adapter.
            PermissionDenied: the caller may not roll this adapter back.
            IntegrityFailure: ARTIFACT_CORRUPTED, a blob of the previous version is damaged.
        """
        planned = partial(self._planned_rollback, name, stage, reason, expected_version, copies)
        with self._with_replicas(switch, planned) as move:
            yield move

    @contextmanager
    def _with_replicas(
        self, switch: ReplicaSwitch, planned: Callable[[], AbstractContextManager[PointerMove]]
    ) -> Iterator[PointerMove]:
        """The move ``planned`` opens (written, not committed; opened again after a lost
        compare-and-set, which comes before anything is switched), the switch applied under
        its lock and audited in its transaction -- and the one undo: a move that does not
        commit reverts the switch, once."""
        if not isinstance(switch, ReplicaSwitch):
            raise TypeError(
                f"a pointer move switches its replicas: switch= takes a ReplicaSwitch "
                f"(the fleet's, or NO_REPLICAS for a registry with none), not {switch!r}"
            )
        try:
            with ExitStack() as held:
                for attempt in tolerating_concurrent_updates():
                    with attempt:
                        move = held.enter_context(planned())
                move.audit(switch.apply(move.plan))
                yield move
            # committed here
        except BaseException:
            # refused, switch failed, block raised or commit failed: the transaction has
            # ended, so what the revert writes to the registry is not blocked by our lock
            switch.revert()
            raise

    @contextmanager
    def _planned_promotion(
        self,
        version_id: str,
        to: str,
        reason: str | None,
        acknowledge_scan_review: bool,
        copies: Mapping[str, Path] | None,
        override: bool = False,
    ) -> Iterator[PointerMove]:
        """The bare promotion (no replicas): private, so only a move with its switch opens it."""
        target = _pointer(to, "to")
        check_text(reason, field="reason")
        if override and not (reason and reason.strip()):
            raise InvalidInput(
                "an override says why: give a --reason", code=ErrorCode.ILLEGAL_TRANSITION, field="reason"
            )
        if override:
            reason = f"override: {reason}"
        action = Action.PROMOTE_PRODUCTION if target == Pointer.PRODUCTION else Action.PROMOTE_CANARY
        principal = self.principal
        if target == Pointer.PRODUCTION and acknowledge_scan_review and self.scan_under_review(version_id):
            reason = f"{reason}; weight-scan review acknowledged" if reason else "weight-scan review acknowledged"
        own_code = (
            self._sign_off_ahead(version_id, acknowledged=acknowledge_scan_review, override=override)
            if target == Pointer.PRODUCTION
            else None
        )
        with self._store.pointers.claim(subject=version_id) as claim:
            principal.require(action, claim.name)  # a denial rolls the claim back: nothing changed
            plan = plan_promotion(claim.pointers, claim.states[version_id], target, claim.states)
            self._verify_targets(plan, claim, acknowledge_scan_review, copies)
            sign_off = self._consume_sign_off(claim, plan, own_code)
            claim.apply(plan, actor=principal.actor, reason=reason, details=sign_off, override=override)
            yield PointerMove(plan, claim.name, principal.actor, reason, claim)

    @contextmanager
    def _planned_rollback(
        self,
        name: str,
        stage: str,
        reason: str | None,
        expected_version: str | None,
        copies: Mapping[str, Path] | None,
    ) -> Iterator[PointerMove]:
        """The bare rollback (no replicas): private, as ``_planned_promotion``."""
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
