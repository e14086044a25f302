"""The lifecycle of an adapter version, enforced in this one place.

::

    register -> staging --validation passed--> canary --approval--> production
                   | failed                      | drift/errors          | superseded / rollback
                   v                             v                       v
                rejected                    rolled_back          retired / rolled_back

    and back:  canary -> retired (another canary replaced it); retired -> production (a
    rollback restores the previous production); retired or rolled_back -> canary (an older
    version canaried again, deliberately). ``ALLOWED`` is the whole table.

A logical adapter has three pointers: ``canary``, ``production`` and ``previous`` (the
production before the current one). Every operation is planned here as a pure function
of the current pointers and stages; the store applies the plan atomically under the
adapter's row lock (``loragate.registry.db.pointers``). Planning an already-done move yields an empty plan, so
retried gates are harmless.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from loragate.registry.errors import ErrorCode, IllegalTransition, InvalidInput


class Stage(StrEnum):
    STAGING = "staging"
    CANARY = "canary"
    PRODUCTION = "production"
    RETIRED = "retired"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"


class Pointer(StrEnum):
    CANARY = "canary"
    PRODUCTION = "production"
    PREVIOUS = "previous"


class ValidationStatus(StrEnum):
    """The outcome of shadow validation a version carries; ``pending`` until its first run."""

    PENDING = "pending"
    PASSED = "passed"
    FAILED = "failed"


ALLOWED: frozenset[tuple[Stage, Stage]] = frozenset(
    {
        (Stage.STAGING, Stage.CANARY),
        (Stage.STAGING, Stage.REJECTED),
        (Stage.CANARY, Stage.PRODUCTION),
        (Stage.CANARY, Stage.ROLLED_BACK),
        (Stage.CANARY, Stage.RETIRED),  # replaced by another canary
        (Stage.PRODUCTION, Stage.RETIRED),  # superseded; kept as `previous`
        (Stage.PRODUCTION, Stage.ROLLED_BACK),
        (Stage.RETIRED, Stage.PRODUCTION),  # rollback restores the previous production
        (Stage.RETIRED, Stage.CANARY),  # deliberate re-canary of an older version
        (Stage.ROLLED_BACK, Stage.CANARY),  # re-canary after a rollback for infra reasons
    }
)


def check_transition(version_id: str, current: Stage, target: Stage) -> None:
    """Raises:
    IllegalTransition: ``current -> target`` is not in the transition table.
    """
    if (current, target) not in ALLOWED:
        raise IllegalTransition(
            f"version {version_id} cannot go from {current.value} to {target.value}",
            field="stage",
        )


@dataclass(frozen=True)
class VersionState:
    version_id: str
    stage: Stage
    validation_status: ValidationStatus


@dataclass
class Plan:
    """What one operation changes: version stages and pointer values, plus its audit."""

    action: str
    stage_changes: list[tuple[str, Stage, Stage]] = field(default_factory=list)
    pointer_changes: dict[Pointer, str | None] = field(default_factory=dict)
    audit_stage: Pointer | None = None
    audit_from: str | None = None
    audit_to: str | None = None
    subject: str | None = None
    # a plan that records something of its own (a validation run) is audited even when it
    # moves nothing; any other empty plan writes nothing at all
    audited_when_empty: bool = False

    @property
    def empty(self) -> bool:
        return not self.stage_changes and not self.pointer_changes

    @property
    def writes_nothing(self) -> bool:
        return self.empty and not self.audited_when_empty

    def targets(self) -> list[tuple[Pointer, str]]:
        """The pointers this plan points somewhere, with the version each will name."""
        return [(pointer, version) for pointer, version in self.pointer_changes.items() if version is not None]

    def move(self, version: VersionState, target: Stage) -> None:
        """Raises:
        IllegalTransition: the version's stage may not move to ``target``.
        """
        check_transition(version.version_id, version.stage, target)
        self.stage_changes.append((version.version_id, version.stage, target))


Pointers = Mapping[Pointer, str | None]
States = Mapping[str, VersionState]


def plan_promotion(pointers: Pointers, version: VersionState, target: Pointer, states: States) -> Plan:
    """Promote ``version`` to the canary or production pointer.

    Raises:
        InvalidInput: ``target`` is the ``previous`` pointer (ILLEGAL_TRANSITION).
        IllegalTransition: canary or production without a passed latest validation
            (VALIDATION_REQUIRED), or any
            move the lifecycle forbids: production from anything but the current canary,
            the production or rollback-target version into canary.
    """
    if target == Pointer.PREVIOUS:
        raise InvalidInput("promote targets canary or production", code=ErrorCode.ILLEGAL_TRANSITION, field="to")
    plan = Plan(action="promote", audit_stage=target, subject=version.version_id, audit_to=version.version_id)
    current = pointers.get(target)
    plan.audit_from = current
    if current == version.version_id:
        return Plan(action="promote")  # already there: nothing to do

    if target == Pointer.CANARY:
        if version.validation_status != ValidationStatus.PASSED:
            raise IllegalTransition(
                f"version {version.version_id} has validation status {version.validation_status.value!r}; "
                "only versions that passed shadow validation may enter canary",
                code=ErrorCode.VALIDATION_REQUIRED,
                field="validation_status",
            )
        if version.version_id == pointers.get(Pointer.PRODUCTION):
            raise IllegalTransition(f"version {version.version_id} is already in production", field="to")
        if version.version_id == pointers.get(Pointer.PREVIOUS):
            raise IllegalTransition(
                f"version {version.version_id} is the rollback target of production; roll back instead",
                field="to",
            )
        if current is not None:
            plan.move(states[current], Stage.RETIRED)
        plan.move(version, Stage.CANARY)
        plan.pointer_changes[Pointer.CANARY] = version.version_id
        return plan

    if version.validation_status != ValidationStatus.PASSED:
        raise IllegalTransition(
            f"version {version.version_id} has validation status {version.validation_status.value!r}; "
            "production takes only a version whose latest validation passed",
            code=ErrorCode.VALIDATION_REQUIRED,
            field="validation_status",
        )
    if pointers.get(Pointer.CANARY) != version.version_id:
        raise IllegalTransition(
            f"version {version.version_id} is {version.stage.value}, not the current canary; "
            "production takes only the canary",
            field="to",
        )
    if current is not None:
        plan.move(states[current], Stage.RETIRED)
        plan.pointer_changes[Pointer.PREVIOUS] = current
    plan.move(version, Stage.PRODUCTION)
    plan.pointer_changes[Pointer.PRODUCTION] = version.version_id
    plan.pointer_changes[Pointer.CANARY] = None
    return plan


def plan_rollback(pointers: Pointers, target: Pointer, states: States, name: str) -> Plan:
    """Production: back to ``previous`` in one pointer move. Canary: withdraw it.

    Raises:
        InvalidInput: ``target`` is the ``previous`` pointer (ILLEGAL_TRANSITION).
        IllegalTransition: nothing at ``target`` to roll back, or no ``previous`` production.
    """
    if target == Pointer.PREVIOUS:
        raise InvalidInput("rollback targets canary or production", code=ErrorCode.ILLEGAL_TRANSITION, field="stage")
    current = pointers.get(target)
    if current is None:
        raise IllegalTransition(f"{name} has no {target.value} version to roll back", field="stage")
    plan = Plan(action="rollback", audit_stage=target, subject=current, audit_from=current)
    plan.move(states[current], Stage.ROLLED_BACK)
    if target == Pointer.CANARY:
        plan.pointer_changes[Pointer.CANARY] = None
        return plan
    previous = pointers.get(Pointer.PREVIOUS)
    if previous is None:
        raise IllegalTransition(f"{name} has no previous production version to roll back to", field="stage")
    plan.move(states[previous], Stage.PRODUCTION)
    plan.pointer_changes[Pointer.PRODUCTION] = previous
    plan.pointer_changes[Pointer.PREVIOUS] = None
    plan.audit_to = previous
    return plan


def plan_validation_result(version: VersionState, status: ValidationStatus) -> Plan:
    """A failed shadow validation rejects a staging version; other stages keep theirs.

    The plan is never empty in effect: the run itself is recorded and audited even when no
    stage changes (a re-validation of a canary, say).
    """
    if status == ValidationStatus.PENDING:
        raise ValueError("a finished validation run is passed or failed, never pending")
    plan = Plan(
        action="validate",
        subject=version.version_id,
        audit_from=version.validation_status.value,
        audit_to=status.value,
        audited_when_empty=True,
    )
    if status == ValidationStatus.FAILED and version.stage == Stage.STAGING:
        plan.move(version, Stage.REJECTED)
    return plan


def check_scan_acknowledged(version_id: str, review: str | None, *, acknowledged: bool) -> None:
    """A version whose weight scan asked for review (``review`` says why) reaches production
    only with an explicit acknowledgement: the one rule the registry, the approval form and
    ``loragate approve`` all apply.

    Raises:
        IllegalTransition: SCAN_REVIEW_UNACKNOWLEDGED.
    """
    if review is not None and not acknowledged:
        raise IllegalTransition(
            f"{version_id} is under weight-scan review ({review}): production needs an explicit "
            "acknowledgement (--acknowledge-scan-review, or the approval form's acknowledge_scan_review)",
            code=ErrorCode.SCAN_REVIEW_UNACKNOWLEDGED,
            field="acknowledge_scan_review",
        )
