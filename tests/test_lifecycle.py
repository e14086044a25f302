"""The lifecycle planners as pure functions: no database, every rule a row of a table; the
stage moves checked against the documented lifecycle, written out here by hand."""

from __future__ import annotations

import contextlib
import itertools

import pytest

from loragate.registry.errors import ErrorCode, IllegalTransition, InvalidInput
from loragate.registry.rules.lifecycle import (
    Pointer,
    Stage,
    ValidationStatus,
    VersionState,
    check_transition,
    plan_promotion,
    plan_rollback,
    plan_validation_result,
)

P, F, N = ValidationStatus.PASSED, ValidationStatus.FAILED, ValidationStatus.PENDING
C, PR, PV = Pointer.CANARY, Pointer.PRODUCTION, Pointer.PREVIOUS


def world(**versions: tuple[Stage, ValidationStatus]) -> dict[str, VersionState]:
    return {v: VersionState(v, stage, status) for v, (stage, status) in versions.items()}


# (case, versions, pointers, subject, target, stage changes, pointer changes)
PROMOTIONS = [
    (
        "first-canary",
        {"v1": (Stage.STAGING, P)},
        {},
        "v1",
        C,
        [("v1", Stage.STAGING, Stage.CANARY)],
        {C: "v1"},
    ),
    (
        "canary-replaces-canary",
        {"v1": (Stage.CANARY, P), "v2": (Stage.STAGING, P)},
        {C: "v1"},
        "v2",
        C,
        [("v1", Stage.CANARY, Stage.RETIRED), ("v2", Stage.STAGING, Stage.CANARY)],
        {C: "v2"},
    ),
    (
        "first-production",
        {"v1": (Stage.CANARY, P)},
        {C: "v1"},
        "v1",
        PR,
        [("v1", Stage.CANARY, Stage.PRODUCTION)],
        {PR: "v1", C: None},
    ),
    (
        "production-keeps-previous",
        {"v1": (Stage.PRODUCTION, P), "v2": (Stage.CANARY, P)},
        {PR: "v1", C: "v2"},
        "v2",
        PR,
        [("v1", Stage.PRODUCTION, Stage.RETIRED), ("v2", Stage.CANARY, Stage.PRODUCTION)],
        {PV: "v1", PR: "v2", C: None},
    ),
    (
        "retired-version-re-canaried",
        {"v1": (Stage.RETIRED, P), "v2": (Stage.PRODUCTION, P)},
        {PR: "v2"},
        "v1",
        C,
        [("v1", Stage.RETIRED, Stage.CANARY)],
        {C: "v1"},
    ),
    (
        "rolled-back-version-re-canaried",
        {"v1": (Stage.ROLLED_BACK, P)},
        {},
        "v1",
        C,
        [("v1", Stage.ROLLED_BACK, Stage.CANARY)],
        {C: "v1"},
    ),
    ("canary-already-there", {"v1": (Stage.CANARY, P)}, {C: "v1"}, "v1", C, [], {}),
    ("production-already-there", {"v1": (Stage.PRODUCTION, P)}, {PR: "v1"}, "v1", PR, [], {}),
]


@pytest.mark.parametrize(
    "case, versions, pointers, subject, target, stages, moved", PROMOTIONS, ids=[c[0] for c in PROMOTIONS]
)
def test_promotion_plans(case, versions, pointers, subject, target, stages, moved):
    states = world(**versions)
    plan = plan_promotion(pointers, states[subject], target, states)
    assert (plan.stage_changes, plan.pointer_changes) == (stages, moved)
    assert plan.empty == (not stages)


# (case, versions, pointers, subject, target, error class, code)
REFUSED_PROMOTIONS = [
    ("pending-into-canary", {"v1": (Stage.STAGING, N)}, {}, "v1", C, ErrorCode.VALIDATION_REQUIRED),
    ("rejected-into-canary", {"v1": (Stage.REJECTED, F)}, {}, "v1", C, ErrorCode.VALIDATION_REQUIRED),
    ("production-into-canary", {"v1": (Stage.PRODUCTION, P)}, {PR: "v1"}, "v1", C, ErrorCode.ILLEGAL_TRANSITION),
    (
        "rollback-target-into-canary",
        {"v1": (Stage.RETIRED, P), "v2": (Stage.PRODUCTION, P)},
        {PR: "v2", PV: "v1"},
        "v1",
        C,
        ErrorCode.ILLEGAL_TRANSITION,
    ),
    ("staging-into-production", {"v1": (Stage.STAGING, P)}, {}, "v1", PR, ErrorCode.ILLEGAL_TRANSITION),
    (
        "not-the-canary-into-production",
        {"v1": (Stage.RETIRED, P), "v2": (Stage.CANARY, P)},
        {C: "v2"},
        "v1",
        PR,
        ErrorCode.ILLEGAL_TRANSITION,
    ),
    ("promote-to-previous", {"v1": (Stage.CANARY, P)}, {C: "v1"}, "v1", PV, ErrorCode.ILLEGAL_TRANSITION),
    # a canary whose re-validation failed does not reach production
    ("failed-canary-into-production", {"v1": (Stage.CANARY, F)}, {C: "v1"}, "v1", PR, ErrorCode.VALIDATION_REQUIRED),
]


@pytest.mark.parametrize(
    "case, versions, pointers, subject, target, code", REFUSED_PROMOTIONS, ids=[c[0] for c in REFUSED_PROMOTIONS]
)
def test_refused_promotions_are_typed(case, versions, pointers, subject, target, code):
    states = world(**versions)
    with pytest.raises(InvalidInput) as err:
        plan_promotion(pointers, states[subject], target, states)
    assert err.value.code == code


# (case, versions, pointers, target, stage changes, pointer changes)
ROLLBACKS = [
    (
        "production-back-to-previous",
        {"v1": (Stage.RETIRED, P), "v2": (Stage.PRODUCTION, P)},
        {PR: "v2", PV: "v1"},
        PR,
        [("v2", Stage.PRODUCTION, Stage.ROLLED_BACK), ("v1", Stage.RETIRED, Stage.PRODUCTION)],
        {PR: "v1", PV: None},
    ),
    (
        "canary-withdrawn",
        {"v1": (Stage.PRODUCTION, P), "v2": (Stage.CANARY, P)},
        {PR: "v1", C: "v2"},
        C,
        [("v2", Stage.CANARY, Stage.ROLLED_BACK)],
        {C: None},
    ),
]


@pytest.mark.parametrize("case, versions, pointers, target, stages, moved", ROLLBACKS, ids=[c[0] for c in ROLLBACKS])
def test_rollback_plans(case, versions, pointers, target, stages, moved):
    plan = plan_rollback(pointers, target, world(**versions), "acme/tiny-llama/support")
    assert (plan.stage_changes, plan.pointer_changes) == (stages, moved)


@pytest.mark.parametrize(
    "versions, pointers, target, error",
    [
        ({"v1": (Stage.PRODUCTION, P)}, {PR: "v1"}, PR, IllegalTransition),  # no previous
        ({}, {}, PR, IllegalTransition),  # nothing in production
        ({}, {}, C, IllegalTransition),  # no canary
        ({"v1": (Stage.RETIRED, P)}, {PV: "v1"}, PV, InvalidInput),  # previous is not a stage to roll back
    ],
    ids=["no-previous", "no-production", "no-canary", "previous-pointer"],
)
def test_refused_rollbacks_are_typed(versions, pointers, target, error):
    with pytest.raises(error) as err:
        plan_rollback(pointers, target, world(**versions), "acme/tiny-llama/support")
    assert err.value.code in (ErrorCode.ILLEGAL_TRANSITION,)


@pytest.mark.parametrize(
    "stage, status, changes",
    [
        (Stage.STAGING, F, [("v1", Stage.STAGING, Stage.REJECTED)]),
        (Stage.STAGING, P, []),
        (Stage.CANARY, F, []),  # a re-validation never moves a version out of canary by itself
        (Stage.PRODUCTION, P, []),
    ],
)
def test_validation_result_plans(stage, status, changes):
    plan = plan_validation_result(VersionState("v1", stage, N), status)
    assert plan.stage_changes == changes
    assert (plan.audit_from, plan.audit_to) == ("pending", status.value)


def test_a_finished_validation_is_never_pending():
    with pytest.raises(ValueError):
        plan_validation_result(VersionState("v1", Stage.STAGING, N), N)


# The lifecycle as documented (docs/concepts/lifecycle.md, the diagram atop registry/rules/lifecycle.py),
# written out move by move with the operation that makes it -- not read from ALLOWED, so a
# change to the table has to be made here too, on purpose. The diagram leaves out three moves
# into and out of canary that the promotion planner makes (the last three), kept on purpose.
LIFECYCLE: dict[tuple[Stage, Stage], str] = {
    (Stage.STAGING, Stage.CANARY): "promote --to canary, once its validation passed",
    (Stage.STAGING, Stage.REJECTED): "its shadow validation failed",
    (Stage.CANARY, Stage.PRODUCTION): "promote --to production: the canary, signed off",
    (Stage.CANARY, Stage.ROLLED_BACK): "the canary withdrawn: rollback --stage canary, auto-rollback, sign-off refused",
    (Stage.PRODUCTION, Stage.RETIRED): "superseded by the next production, kept as `previous`",
    (Stage.PRODUCTION, Stage.ROLLED_BACK): "rollback --stage production",
    (Stage.RETIRED, Stage.PRODUCTION): "rollback: `previous` back in production",
    (Stage.CANARY, Stage.RETIRED): "replaced by another version promoted to canary",
    (Stage.RETIRED, Stage.CANARY): "an older version deliberately canaried again",
    (Stage.ROLLED_BACK, Stage.CANARY): "canaried again after a rollback for infrastructure reasons",
}
STAGES = ("staging", "canary", "production", "retired", "rejected", "rolled_back")


def test_the_lifecycle_oracle_names_every_stage_there_is():
    """A stage added to the code is a stage the oracle above must be told about."""
    assert tuple(s.value for s in Stage) == STAGES


@pytest.mark.parametrize(
    "current, target", list(itertools.product(Stage, Stage)), ids=lambda s: s.value if isinstance(s, Stage) else s
)
def test_a_stage_move_is_allowed_exactly_when_the_documented_lifecycle_has_it(current, target):
    if (current, target) in LIFECYCLE:
        check_transition("v1", current, target)
    else:
        with pytest.raises(IllegalTransition) as err:
            check_transition("v1", current, target)
        assert err.value.code == ErrorCode.ILLEGAL_TRANSITION


def test_nothing_leaves_rejected():
    """A version that failed validation is final: a fix is a new version."""
    for target in Stage:
        with pytest.raises(IllegalTransition):
            check_transition("v1", Stage.REJECTED, target)


def consistent_worlds():
    """Every state of one adapter with three versions that the registry can be in: each
    pointer names a version in its stage (canary, production, retired for `previous`), no
    `previous` without a production, every other version staging, rejected, retired or
    rolled back, with a validation status its stage allows."""
    ids = ("v1", "v2", "v3")
    unpointed = {
        Stage.STAGING: (N, P, F),
        Stage.REJECTED: (F,),
        Stage.RETIRED: (P,),
        Stage.ROLLED_BACK: (P, F),
    }
    choices = (None, *ids)
    for canary, production, previous in itertools.product(choices, repeat=3):
        named = [v for v in (canary, production, previous) if v is not None]
        if len(set(named)) != len(named) or (previous and not production):
            continue
        pointers = {C: canary, PR: production, PV: previous}
        fixed = {canary: (Stage.CANARY, P), production: (Stage.PRODUCTION, P), previous: (Stage.RETIRED, P)}
        free = [v for v in ids if v not in named]
        options = [(stage, status) for stage, statuses in unpointed.items() for status in statuses]
        for picked in itertools.product(options, repeat=len(free)):
            versions = {v: sv for v, sv in fixed.items() if v is not None} | dict(zip(free, picked, strict=True))
            yield {k: v for k, v in pointers.items() if v is not None}, world(**versions)


def moves_the_operations_make() -> set[tuple[Stage, Stage]]:
    """Every (from, to) stage change a promotion, a rollback or a validation result plans,
    from every consistent state; refusals plan nothing."""
    made: set[tuple[Stage, Stage]] = set()
    for pointers, states in consistent_worlds():
        plans = []
        for version in states.values():
            for target in (C, PR):
                with contextlib.suppress(InvalidInput):  # IllegalTransition is one
                    plans.append(plan_promotion(pointers, version, target, states))
            plans += [plan_validation_result(version, status) for status in (P, F)]
        for target in (C, PR):
            with contextlib.suppress(InvalidInput):
                plans.append(plan_rollback(pointers, target, states, "acme/tiny-llama/support"))
        made |= {(old, new) for plan in plans for _, old, new in plan.stage_changes}
    return made


def test_every_documented_move_is_made_by_some_operation_and_no_operation_makes_another():
    """No dead row in the lifecycle, no move outside it: the planners, run on every state the
    registry can be in, make exactly the documented moves."""
    made = moves_the_operations_make()
    assert made - LIFECYCLE.keys() == set(), "moves the lifecycle does not document"
    assert LIFECYCLE.keys() - made == set(), "documented moves no operation makes"
