"""A production sign-off proves who gave it: an approval code issued to the reviewer's own
activation token, bound to the window, the reviewer, the decision and an expiry, good once.
Every way a code can fail to prove a decision is a row of a table, refused with its own
code and changing nothing but the audit log; racing resumes with one code record one
decision; racing promote runs claim one sign-off; the production move consumes it. SQLite
and Postgres alike. Rollback codes are ``test_rollback_codes.py``'s, ``loragate
approve-code`` is ``test_approve_code_cli.py``'s; both use this module's ``signoff``."""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from loragate.registry.db.schema import approval_codes, canary_windows
from loragate.registry.errors import (
    ApprovalRefused,
    ErrorCode,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
)
from loragate.registry.rules.approvals import Decision
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.service import Registry
from tests.support.moves import promote
from tests.support.registries import mark_ready, mark_validated, sql_engine

NAME = "acme/tiny-llama/support"
FORGED = "lac_" + "0" * 12 + "_" + "A" * 22


@dataclass
class SignOff:
    """A version on canary whose window is ready, a promote run waiting for its sign-off,
    and one registry per token: two reviewers, the pipeline's own activation token, a
    trainer, and a reviewer limited to another namespace."""

    owner: Registry
    v1: str
    v2: str
    window_id: int
    as_: dict[str, Registry]
    token_ids: dict[str, str]
    tokens: dict[str, str]

    def code(self, who: str = "alice", *, approve: bool = True, ttl_s: float | None = None) -> str:
        return self.as_[who].issue_approval_code(self.v1, decision=Decision.of(approve), ttl_s=ttl_s)[1]

    def record(
        self,
        code: str,
        *,
        reviewer: str = "alice",
        approve: bool = True,
        window_id: int | None = None,
        acting: str = "pipeline",
    ):
        return self.as_[acting].record_approval(
            window_id or self.window_id, approve=approve, reviewer=reviewer, code=code, comment="ok", flow_run_id="r1"
        )

    def events(self, action: str) -> list:
        return [e for e in self.owner.history(NAME) if e.action == action]


@pytest.fixture
def signoff(cataloged, seeded_bundles):
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    v2 = registry.register_adapter(seeded_bundles[1], NAME).version.version_id
    for v in (v1, v2):
        mark_validated(registry, v)
    promote(registry, v1, "canary")
    window, _ = registry.open_canary_window(v1)
    mark_ready(registry, window.id)
    registry.request_approval(window.id, "run-1")
    holders = {
        "alice": ("activation", None),
        "bob": ("activation", None),
        "pipeline": ("activation", None),
        "trainer": ("training", None),
        "elsewhere": ("activation", "other/*"),
    }
    opened, token_ids, tokens = {}, {}, {}
    for who, (role, namespace) in holders.items():
        record, token = registry.create_token(role, who, namespace=namespace, pipeline=who == "pipeline")
        token_ids[who], tokens[who] = record.token_id, token
        opened[who] = Registry.open(registry.settings.model_copy(update={"token": token}))
    yield SignOff(registry, v1, v2, window.id, opened, token_ids, tokens)
    for r in opened.values():
        r.close()


@pytest.mark.parametrize("approve", [True, False], ids=["approve", "reject"])
def test_a_code_records_its_decision_once_and_the_audit_names_the_token_that_proved_it(signoff, approve):
    code = signoff.code(approve=approve)
    after = signoff.record(code, approve=approve)
    assert after.status == (WindowStatus.READY if approve else WindowStatus.REJECTED)
    (event,) = signoff.events("approval")
    stored = signoff.owner.approval_codes(signoff.window_id)[-1]
    assert event.details["token_id"] == signoff.token_ids["alice"] == stored.token_id
    assert event.details["approval_code"] == stored.code_id and event.details["reviewer"] == "alice"
    assert event.actor.startswith("pipeline (activation token ")
    assert stored.used_at is not None and stored.used_by == "r1"
    assert code not in repr(stored) and stored.secret_hash not in str(stored.as_dict())


def _expire(signoff: SignOff) -> str:
    code = signoff.code()
    with sql_engine(signoff.owner).begin() as conn:
        conn.execute(update(approval_codes).values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    return code


def _other_window(signoff: SignOff) -> tuple[str, dict]:
    """A code for v1's window, offered for v2's (v2 entered canary since)."""
    code = signoff.code()
    promote(signoff.owner, signoff.v2, "canary")
    window, _ = signoff.owner.open_canary_window(signoff.v2)
    mark_ready(signoff.owner, window.id)
    return code, {"window_id": window.id}


def _revoked(signoff: SignOff) -> str:
    code = signoff.code()
    signoff.owner.revoke_token(signoff.token_ids["alice"])
    return code


# (case, how the code is made -> code or (code, overrides of the offer), refusal code)
REFUSALS = [
    ("forged", lambda s: FORGED, ErrorCode.APPROVAL_CODE_INVALID),
    ("not-a-code", lambda s: "alice says yes", ErrorCode.APPROVAL_CODE_INVALID),
    ("empty", lambda s: "", ErrorCode.APPROVAL_CODE_INVALID),
    ("wrong-secret", lambda s: s.code()[:-4] + "AAAA", ErrorCode.APPROVAL_CODE_INVALID),
    ("expired", _expire, ErrorCode.APPROVAL_CODE_EXPIRED),
    ("someone-elses", lambda s: (s.code("bob"), {"reviewer": "alice"}), ErrorCode.APPROVAL_CODE_MISMATCH),
    ("another-reviewer-typed", lambda s: (s.code(), {"reviewer": "bob"}), ErrorCode.APPROVAL_CODE_MISMATCH),
    ("issued-to-reject", lambda s: s.code(approve=False), ErrorCode.APPROVAL_CODE_MISMATCH),
    ("another-version", _other_window, ErrorCode.APPROVAL_CODE_MISMATCH),
    ("token-revoked", _revoked, ErrorCode.APPROVAL_CODE_REVOKED),
    ("the-acting-tokens-own", lambda s: (s.code(), {"acting": "alice"}), ErrorCode.APPROVAL_CODE_SELF),
]


@pytest.mark.parametrize("case, make, refusal", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_code_that_does_not_prove_the_decision_is_refused_and_records_nothing(signoff, case, make, refusal):
    made = make(signoff)
    code, offer = made if isinstance(made, tuple) else (made, {})
    codes_before = signoff.owner.approval_codes(offer.get("window_id", signoff.window_id))
    with pytest.raises(ApprovalRefused) as refused:
        signoff.record(code, **offer)
    assert (refused.value.code, refused.value.field) == (refusal, "code")
    assert code[-22:] not in refused.value.message if code else True  # the secret is never repeated
    window = signoff.owner.canary_window(offer.get("window_id", signoff.window_id))
    assert window.status == WindowStatus.READY
    assert signoff.events("approval") == []
    # a code presented with its secret is spent, refused or not; no other code is touched
    presented = code.split("_")[1] if refusal != ErrorCode.APPROVAL_CODE_INVALID else None
    after = {c.code_id: c for w in {signoff.window_id, window.id} for c in signoff.owner.approval_codes(w)}
    for before in codes_before:
        if before.code_id != presented:
            assert after[before.code_id] == before
    if presented is not None:
        assert after[presented].used_by == f"refused: {refusal.value}" and after[presented].used_at is not None
    (audited,) = signoff.events("approval_refused")
    assert audited.to_value == refusal.value and audited.details["window_id"] == window.id


# (what was wrong with the first form) -- each read back and corrected by whoever reads the
# orchestrator's stored input
FIRST_FORMS = [
    ("another-reviewer-typed", {"reviewer": "bob"}),
    ("rejected-with-an-approve-code", {"approve": False}),
    ("the-acting-tokens-own", {"acting": "alice"}),
]


@pytest.mark.parametrize("case, first", FIRST_FORMS, ids=[f[0] for f in FIRST_FORMS])
def test_a_code_presented_and_refused_is_spent_so_the_corrected_form_proves_nothing(signoff, case, first):
    code = signoff.code()
    with pytest.raises(ApprovalRefused):
        signoff.record(code, **first)
    with pytest.raises(ApprovalRefused) as replayed:
        signoff.record(code)
    assert replayed.value.code == ErrorCode.APPROVAL_CODE_USED
    assert signoff.events("approval") == []
    with pytest.raises(PermissionDenied) as moved:  # and no production move can apply it
        promote(signoff.as_["pipeline"], signoff.v1, "production")
    assert moved.value.code == ErrorCode.APPROVAL_REQUIRED
    assert signoff.owner.get_adapter(NAME).production is None
    signoff.record(signoff.code())  # a fresh code from the person still works
    promote(signoff.as_["pipeline"], signoff.v1, "production")
    assert signoff.owner.get_adapter(NAME).production == signoff.v1


def _revoke_reviewer(s: SignOff) -> None:
    s.owner.revoke_token(s.token_ids["alice"])


def _close_window(s: SignOff) -> None:
    """The window stops waiting (written as the owner: a monitor's rollback would also
    withdraw the canary, which refuses the move on its own)."""
    with sql_engine(s.owner).begin() as conn:
        conn.execute(update(canary_windows).where(canary_windows.c.id == s.window_id).values(status="rolled_back"))


def _outlive(s: SignOff) -> None:
    """The code redeemed longer ago than it lives (900 s by default)."""
    with sql_engine(s.owner).begin() as conn:
        conn.execute(update(approval_codes).values(used_at=datetime.now(UTC) - timedelta(days=60)))


# what happens between a sign-off's redemption and the production move that would apply it
STALE_SIGN_OFFS = [
    ("reviewer-token-revoked", _revoke_reviewer),
    ("window-superseded", _close_window),
    ("redeemed-months-ago", _outlive),
]


@pytest.mark.parametrize("case, between", STALE_SIGN_OFFS, ids=[c[0] for c in STALE_SIGN_OFFS])
def test_a_redeemed_sign_off_is_applied_only_while_it_lives_its_token_is_active_and_its_window_waits(
    signoff, case, between
):
    signoff.record(signoff.code())
    between(signoff)
    before = signoff.owner.get_adapter(NAME).production
    with pytest.raises(PermissionDenied) as refused:
        promote(signoff.as_["pipeline"], signoff.v1, "production")
    assert refused.value.code == ErrorCode.APPROVAL_REQUIRED
    assert signoff.owner.get_adapter(NAME).production == before
    with sql_engine(signoff.owner).connect() as conn:
        assert conn.execute(approval_codes.select().where(approval_codes.c.applied_at.is_not(None))).all() == []


def test_a_used_code_is_refused_the_second_time(signoff):
    code = signoff.code()
    signoff.record(code)
    with pytest.raises(ApprovalRefused) as again:
        signoff.record(code)
    assert again.value.code == ErrorCode.APPROVAL_CODE_USED
    assert len(signoff.events("approval")) == 1


@pytest.mark.parametrize(
    "who, ttl_s, error, code",
    [
        ("trainer", None, PermissionDenied, ErrorCode.PERMISSION_DENIED),
        ("pipeline", None, PermissionDenied, ErrorCode.PERMISSION_DENIED),
        ("elsewhere", None, PermissionDenied, ErrorCode.PERMISSION_DENIED),
        ("owner", None, PermissionDenied, ErrorCode.PERMISSION_DENIED),
        ("alice", 5, InvalidInput, ErrorCode.INVALID_SETTING),
        ("alice", 2 * 86400, InvalidInput, ErrorCode.INVALID_SETTING),
    ],
    ids=[
        "a-training-token",
        "a-pipeline-token",
        "another-namespace",
        "no-token-at-all",
        "ttl-too-short",
        "ttl-too-long",
    ],
)
def test_only_an_activation_token_for_the_adapter_gets_a_code_and_a_refusal_writes_nothing(
    signoff, who, ttl_s, error, code
):
    registry = signoff.owner if who == "owner" else signoff.as_[who]
    before = signoff.owner.history(NAME)
    with pytest.raises(error) as refused:
        registry.issue_approval_code(signoff.v1, ttl_s=ttl_s)
    assert refused.value.code == code
    assert signoff.owner.history(NAME) == before and signoff.owner.approval_codes(signoff.window_id) == []


def test_no_code_is_issued_for_a_window_that_waits_for_no_sign_off(signoff):
    signoff.record(signoff.code(approve=False), approve=False)  # rejected: the window is closed
    with pytest.raises(IllegalTransition):
        signoff.code()
    with pytest.raises(NotFound):
        signoff.as_["alice"].issue_approval_code(signoff.v2)  # never canaried


def test_racing_resumes_with_one_code_record_one_decision(signoff):
    code = signoff.code()
    racers = 8
    registries = [Registry.open(signoff.as_["pipeline"].settings) for _ in range(racers)]
    barrier = threading.Barrier(racers)

    def race(registry: Registry) -> str:
        barrier.wait()
        try:
            registry.record_approval(signoff.window_id, approve=True, reviewer="alice", code=code, flow_run_id="r")
            return "recorded"
        except ApprovalRefused as refused:
            return refused.code.value

    try:
        with concurrent.futures.ThreadPoolExecutor(racers) as pool:
            outcomes = list(pool.map(race, registries))
    finally:
        for r in registries:
            r.close()
    assert sorted(outcomes) == ["approval_code_used"] * (racers - 1) + ["recorded"]
    assert len(signoff.events("approval")) == 1


def test_racing_promote_runs_claim_one_sign_off(signoff):
    racers = 8
    fresh_window = signoff.owner.canary_window(signoff.window_id)
    registries = [Registry.open(signoff.as_["pipeline"].settings) for _ in range(racers)]
    barrier = threading.Barrier(racers)

    def race(i: int) -> str | None:
        barrier.wait()
        # racers are named apart from the run they replace: "run-1" is the one waiting now
        return registries[i].request_approval(fresh_window.id, f"racer-{i}", replacing="run-1").approval_flow_run_id

    try:
        with concurrent.futures.ThreadPoolExecutor(racers) as pool:
            holders = set(pool.map(race, range(racers)))
    finally:
        for r in registries:
            r.close()
    assert len(holders) == 1 and holders != {"run-1"}
    assert [e.to_value for e in signoff.events("approval_requested")][1:] == list(holders)


# -- the production move consumes a sign-off ---------------------------------------------


def test_a_pipeline_token_moves_production_only_by_consuming_a_persons_sign_off(signoff):
    pipeline = signoff.as_["pipeline"]
    before = signoff.owner.history(NAME)
    with pytest.raises(PermissionDenied) as refused:
        promote(pipeline, signoff.v1, "production")  # e.g. code run on the release pool's worker
    assert (refused.value.code, refused.value.field) == (ErrorCode.APPROVAL_REQUIRED, "approval")
    assert signoff.owner.get_adapter(NAME).production is None and signoff.owner.history(NAME) == before

    signoff.record(signoff.code())  # alice's sign-off, redeemed by the flow
    promote(pipeline, signoff.v1, "production")
    (move,) = [e for e in signoff.events("promote") if e.stage == "production"]
    (code,) = signoff.owner.approval_codes(signoff.window_id)
    assert move.details["approval_code"] == code.code_id and code.reviewer == "alice"
    with sql_engine(signoff.owner).connect() as conn:
        applied = conn.execute(approval_codes.select().where(approval_codes.c.code_id == code.code_id)).one()
    assert applied.applied_at is not None  # consumed: it moves production once


def test_a_persons_own_production_move_is_a_sign_off_of_their_token(signoff):
    promote(signoff.as_["alice"], signoff.v1, "production")
    (move,) = [e for e in signoff.events("promote") if e.stage == "production"]
    with sql_engine(signoff.owner).connect() as conn:
        own = conn.execute(
            approval_codes.select().where(approval_codes.c.code_id == move.details["approval_code"])
        ).one()
    assert (own.token_id, own.reviewer, own.decision, own.window_id) == (
        signoff.token_ids["alice"],
        "alice",
        "approve",
        None,
    )
    assert own.used_at is not None and own.applied_at is not None
