"""A rollback started through the pipeline needs a person's rollback code for the version
the stage serves, by the sign-off's rules (``test_approvals.py``): redeemed once and named
in the audit by the token that proved it; no code, a forged one, a sign-off code or one for
another stage's version is refused and nothing moves; a rollback already made needs none;
a code is issued only for a version a stage serves, to an activation token. SQLite and
Postgres alike."""

from __future__ import annotations

import pytest

from loragate.registry.errors import ApprovalRefused, ErrorCode, IllegalTransition, PermissionDenied
from loragate.registry.rules.approvals import Decision
from tests import test_approvals
from tests.support.moves import promote, rollback
from tests.test_approvals import FORGED, NAME, SignOff

# test_approvals' fixture: a version on canary, its window ready, its sign-off pending
signoff = test_approvals.signoff


@pytest.fixture
def in_production(signoff):
    """v1 in production (signed off), v2 on canary: rollback codes have something to decide on.
    A second sign-off code for v1 is issued while its window is still ready (the promotion
    ends the window, and no sign-off code is issued after it) and kept unused."""
    SPARE_SIGN_OFF.clear()
    SPARE_SIGN_OFF.append(signoff.code("bob"))
    signoff.record(signoff.code())
    promote(signoff.owner, signoff.v1, "production")
    promote(signoff.owner, signoff.v2, "canary")
    return signoff


SPARE_SIGN_OFF: list[str] = []  # in_production's unused sign-off code for v1


def rollback_code(s: SignOff, version: str, who: str = "alice") -> str:
    return s.as_[who].issue_approval_code(version, decision=Decision.ROLLBACK)[1]


def test_a_rollback_code_for_what_a_stage_serves_is_redeemed_once_and_names_its_token(in_production):
    s = in_production
    code = rollback_code(s, s.v1)
    proven = s.as_["pipeline"].redeem_rollback_code(NAME, "production", code, used_by="run-r")
    assert (proven.version_id, proven.reviewer, proven.token_id) == (s.v1, "alice", s.token_ids["alice"])
    (event,) = s.events("rollback_approval")
    assert event.details == {"reviewer": "alice", "token_id": s.token_ids["alice"], "approval_code": proven.code_id}
    with pytest.raises(ApprovalRefused) as again:
        s.as_["pipeline"].redeem_rollback_code(NAME, "production", code, used_by="run-r")
    assert again.value.code == ErrorCode.APPROVAL_CODE_USED
    canary = rollback_code(s, s.v2)  # the canary too: a code for the version it serves
    assert s.as_["pipeline"].redeem_rollback_code(NAME, "canary", canary, used_by="run-c").version_id == s.v2


@pytest.mark.parametrize(
    "case, make, stage, refusal",
    [
        ("no-code", lambda s: "", "production", ErrorCode.APPROVAL_CODE_INVALID),
        ("forged", lambda s: FORGED, "production", ErrorCode.APPROVAL_CODE_INVALID),
        ("a-sign-off-code", lambda s: SPARE_SIGN_OFF[0], "production", ErrorCode.APPROVAL_CODE_MISMATCH),
        ("for-the-canarys-version", lambda s: rollback_code(s, s.v2), "production", ErrorCode.APPROVAL_CODE_MISMATCH),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_rollback_without_a_code_proving_it_is_refused_and_nothing_moves(in_production, case, make, stage, refusal):
    s = in_production
    code = make(s)
    before = s.owner.get_adapter(NAME)
    with pytest.raises(ApprovalRefused) as refused:
        s.as_["pipeline"].redeem_rollback_code(NAME, stage, code, used_by="run-x")
    assert refused.value.code == refusal
    assert s.owner.get_adapter(NAME) == before and s.events("rollback_approval") == []
    assert s.events("approval_refused")[-1].to_value == refusal.value


def test_a_rollback_already_made_needs_no_code_and_uses_none(in_production):
    """A re-run after the rollback happened: the stage no longer serves the expected version."""
    s = in_production
    code = rollback_code(s, s.v1)
    assert s.as_["pipeline"].redeem_rollback_code(NAME, "production", "", expected_version=s.v2, used_by="x") is None
    assert s.events("approval_refused") == [] and s.events("rollback_approval") == []
    assert s.as_["pipeline"].redeem_rollback_code(NAME, "production", code, expected_version=s.v1, used_by="x")


def test_a_rollback_code_is_issued_only_for_a_version_a_stage_serves(in_production):
    s = in_production
    rollback(s.owner, NAME, "canary")  # v2 withdrawn: nothing serves it any more
    with pytest.raises(IllegalTransition):
        rollback_code(s, s.v2)
    with pytest.raises(PermissionDenied):
        rollback_code(s, s.v1, "trainer")
