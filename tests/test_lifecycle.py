"""The lifecycle planners as pure functions: no database, every rule a row of a table."""

from __future__ import annotations

import itertools

import pytest

from registry.errors import ErrorCode, IllegalTransition, InvalidInput
from registry.rules.lifecycle import (
    ALLOWED,
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


@pytest.mark.parametrize("current, target", list(itertools.product(Stage, Stage)))
def test_every_stage_pair_is_allowed_exactly_when_the_table_says_so(current, target):
    if (current, target) in ALLOWED:
        check_transition("v1", current, target)
    else:
        with pytest.raises(IllegalTransition):
            check_transition("v1", current, target)


def test_nothing_leaves_rejected():
    """A version that failed validation is final: a fix is a new version."""
    assert [b for a, b in ALLOWED if a == Stage.REJECTED] == []
