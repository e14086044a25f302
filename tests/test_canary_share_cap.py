"""Who may send users where, as the application decides it on SQLite and Postgres alike (the
database's own rules for its roles' users: tests/test_canary_rules_in_sql.py).

A canary window's share is at most ``LORAGATE_CANARY_MAX_SHARE`` until a person has signed
its version off: above it only a caller who may promote, while that sign-off is redeemed and
not yet applied -- the promotion's own "every user to the canary first" step -- or the
registry's owner in process. A refusal is SHARE_ABOVE_CAP (a permission: exit 3) and changes
nothing. A window is opened only for the adapter's canary, validated and signed by an active
signing key. Each window has a random bucket key that never leaves the registry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from loragate.registry.db.schema import approval_codes, audit_events, canary_windows, registry_limits
from loragate.registry.errors import DeployFailed, ErrorCode, IllegalTransition, PermissionDenied
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair, key_id
from loragate.tasks.canary_moves import deploy_canary, promote_canary
from loragate.tasks.fleet import FleetSwitch
from tests.support.moves import promote
from tests.support.registries import mark_ready, mark_validated, registry_snapshot, sql_engine

NAME = "acme/tiny-llama/support"
OTHER = "acme/tiny-llama/tickets"
OPENED_AT = 0.2


@dataclass
class Canaried:
    """v1 on canary with a window at 20 %, ready for its sign-off; tokens: a signing one, the
    release pool's activation one (a pipeline's), a reviewer's (a person's)."""

    owner: Registry
    v1: str
    window_id: int
    as_: dict[str, Registry]
    tokens: dict[str, str]

    def stored_share(self) -> float:
        engine = sql_engine(self.owner)
        try:
            with engine.connect() as conn:
                found = select(canary_windows.c.share).where(canary_windows.c.id == self.window_id)
                return conn.execute(found).scalar_one()
        finally:
            engine.dispose()

    def sign_off(self) -> None:
        """The reviewer's code redeemed by the release pool: the sign-off waits to be applied."""
        _, code = self.as_["reviewer"].issue_approval_code(self.v1)
        self.as_["release"].record_approval(self.window_id, approve=True, reviewer="reviewer", code=code)


@pytest.fixture
def canaried(cataloged, seeded_bundles):
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    window, _ = registry.open_canary_window(v1, share=OPENED_AT)
    mark_ready(registry, window.id)
    registry.request_approval(window.id, "run-1")
    holders = {"signing": ("signing", False), "release": ("activation", True), "reviewer": ("activation", False)}
    opened, tokens = {}, {}
    for who, (role, pipeline) in holders.items():
        tokens[who] = registry.create_token(role, who, pipeline=pipeline)[1]
        opened[who] = Registry.open(registry.settings.model_copy(update={"token": tokens[who]}))
    yield Canaried(registry, v1, window.id, opened, tokens)
    for r in opened.values():
        r.close()


def refused_above_the_cap(c: Canaried, change: Callable[[], object]) -> None:
    before = registry_snapshot(c.owner.settings, artifacts=False)
    with pytest.raises(PermissionDenied) as refused:
        change()
    assert (refused.value.code, refused.value.field) == (ErrorCode.SHARE_ABOVE_CAP, "share")
    assert registry_snapshot(c.owner.settings, artifacts=False) == before


# -- the cap -------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [0.51, 1.0])
@pytest.mark.parametrize("who", ["signing", "release"])
def test_a_share_above_the_cap_without_a_pending_sign_off_is_refused_and_changes_nothing(canaried, who, share):
    registry = canaried.as_[who]
    refused_above_the_cap(canaried, lambda: registry.set_canary_share(NAME, share))
    refused_above_the_cap(canaried, lambda: registry.check_canary_share(NAME, share))
    assert canaried.stored_share() == OPENED_AT
    assert not registry.canary_share_allowed(registry.canary_window(canaried.window_id), share)


@pytest.mark.parametrize("who", ["signing", "release"])
def test_up_to_the_cap_whoever_watches_the_canary_sets_its_share(canaried, who):
    assert canaried.as_[who].set_canary_share(NAME, 0.5).share == 0.5


def test_the_owner_in_process_may_give_the_canary_every_user(canaried):
    assert canaried.owner.set_canary_share(NAME, 1.0).share == 1.0


def test_lowering_a_share_above_the_cap_needs_no_sign_off(canaried):
    canaried.owner.set_canary_share(NAME, 1.0)
    assert canaried.as_["signing"].set_canary_share(NAME, 0.9).share == 0.9
    assert canaried.as_["signing"].set_canary_share(NAME, 0.0).share == 0.0


def test_the_cap_is_the_operators_setting(canaried):
    settings = canaried.as_["signing"].settings.model_copy(update={"canary_max_share": 0.8})
    with Registry.open(settings) as signing:
        assert signing.set_canary_share(NAME, 0.8).share == 0.8
        refused_above_the_cap(canaried, lambda: signing.set_canary_share(NAME, 0.81))


def _revoke_reviewer(c: Canaried) -> None:
    c.owner.revoke_token(c.as_["reviewer"].principal.token_id or "")


def _outlive(c: Canaried) -> None:
    with sql_engine(c.owner).begin() as conn:
        conn.execute(update(approval_codes).values(used_at=datetime.now(UTC) - timedelta(days=1)))


# (case, what happens after the sign-off is redeemed, whether the release pool may then send
# every user to the canary)
SIGN_OFFS: list[tuple[str, Callable[[Canaried], object] | None, bool]] = [
    ("redeemed-and-pending", None, True),
    ("its-reviewer-revoked-since", _revoke_reviewer, False),
    ("redeemed-longer-ago-than-it-lives", _outlive, False),
]


@pytest.mark.parametrize(("case", "after", "allowed"), SIGN_OFFS, ids=[s[0] for s in SIGN_OFFS])
def test_every_user_goes_to_the_canary_only_on_a_persons_sign_off_pending(canaried, case, after, allowed):
    canaried.sign_off()
    if after is not None:
        after(canaried)
    release = canaried.as_["release"]
    window = release.canary_window(canaried.window_id)
    assert release.canary_share_allowed(window, 1.0) is allowed
    if allowed:
        assert release.set_canary_share(NAME, 1.0).share == 1.0
    else:
        refused_above_the_cap(canaried, lambda: release.set_canary_share(NAME, 1.0))


def test_a_pending_sign_off_does_not_lift_the_cap_for_a_role_that_cannot_promote(canaried):
    canaried.sign_off()
    refused_above_the_cap(canaried, lambda: canaried.as_["signing"].set_canary_share(NAME, 1.0))


# -- the promotion's own step ------------------------------------------------------------------


def all_user_steps(c: Canaried) -> list[str | None]:
    return [e.to_value for e in c.owner.history(NAME) if e.action == "canary_share" and e.to_value == "1.0"]


def test_the_promotion_sends_every_user_to_the_canary_first_on_a_redeemed_sign_off(canaried):
    canaried.sign_off()
    closed, _, _ = promote_canary(canaried.as_["release"], canaried.v1, "signed off")
    assert closed.status == WindowStatus.PROMOTED and closed.share == 1.0
    assert all_user_steps(canaried) == ["1.0"]
    assert canaried.owner.get_adapter(NAME).production == canaried.v1


def test_a_promotion_with_no_sign_off_pending_skips_the_every_user_step_and_still_moves(canaried):
    """A person promoting with their own token signs off inside the move itself: nothing
    waits to be applied before it, so the switch moves the users."""
    closed, _, _ = promote_canary(canaried.as_["reviewer"], canaried.v1, "promoted by a person")
    assert closed.status == WindowStatus.PROMOTED and closed.share == OPENED_AT
    assert all_user_steps(canaried) == []
    assert canaried.owner.get_adapter(NAME).production == canaried.v1


def test_a_promotion_that_does_not_commit_puts_the_split_back_in_the_switchs_one_undo(canaried, monkeypatch):
    """Every user went to the canary ahead of the move and a replica could not be switched:
    the move reverts its switch, once, and that revert puts the split back as it was."""
    canaried.sign_off()
    revert = FleetSwitch.revert
    reverts: list[FleetSwitch] = []

    def no_replica_switches(switch: FleetSwitch, plan: object) -> list:
        raise DeployFailed(f"{NAME}: replica http://replica:1 failed", field="url")

    def counted(switch: FleetSwitch) -> None:
        reverts.append(switch)
        revert(switch)

    monkeypatch.setattr(FleetSwitch, "apply", no_replica_switches)
    monkeypatch.setattr(FleetSwitch, "revert", counted)
    with pytest.raises(DeployFailed):
        promote_canary(canaried.as_["release"], canaried.v1, "signed off")
    shares = [(e.to_value, e.reason) for e in canaried.owner.history(NAME) if e.action == "canary_share"]
    assert shares[-2:] == [
        ("1.0", "promotion: all live traffic to the canary"),
        (repr(OPENED_AT), "promotion failed: the split as it was"),
    ]
    assert canaried.stored_share() == OPENED_AT and len(reverts) == 1
    assert canaried.owner.get_adapter(NAME).production is None
    assert canaried.owner.canary_window(canaried.window_id).status == WindowStatus.READY


# -- opening a window ----------------------------------------------------------------------


def _unsigned(r: Registry, v: str) -> None:
    mark_validated(r, v, signed=False)


def _failed_since(r: Registry, v: str) -> None:
    mark_validated(r, v)
    mark_validated(r, v, passed=False)


def _signed_by_a_key_revoked_since(r: Registry, v: str) -> None:
    mark_validated(r, v, signed=False)
    key = generate_key_pair()
    r.add_signing_key(key.public_pem, "signing", "revoked-since")
    r.sign_version(v, key.private_pem)
    r.revoke_signing_key(key_id(key.public_pem))


def _signed_over_an_older_validation(r: Registry, v: str) -> None:
    mark_validated(r, v)
    mark_validated(r, v, signed=False)


# (case, how the canary got where it is, the refusal's code)
UNFIT_CANARIES = [
    ("unsigned", _unsigned, ErrorCode.SIGNATURE_REQUIRED),
    ("its-latest-validation-failed", _failed_since, ErrorCode.VALIDATION_REQUIRED),
    ("signed-by-a-key-revoked-since", _signed_by_a_key_revoked_since, ErrorCode.SIGNATURE_REQUIRED),
    ("signed-over-an-older-validation", _signed_over_an_older_validation, ErrorCode.SIGNATURE_REQUIRED),
]


@pytest.mark.parametrize(("case", "made", "code"), UNFIT_CANARIES, ids=[u[0] for u in UNFIT_CANARIES])
def test_a_window_opens_only_for_a_validated_canary_signed_over_its_latest_validation(
    cataloged, seeded_bundles, case, made, code
):
    registry, _ = cataloged
    v = registry.register_adapter(seeded_bundles[1], OTHER).version.version_id
    mark_validated(registry, v, signed=False)
    promote(registry, v, "canary")
    made(registry, v)
    before = registry_snapshot(registry.settings, artifacts=False)
    with pytest.raises(IllegalTransition) as refused:
        registry.open_canary_window(v)
    assert (refused.value.code, refused.value.field) == (code, "version_id")
    assert registry_snapshot(registry.settings, artifacts=False) == before


@pytest.mark.parametrize(("case", "made", "code"), UNFIT_CANARIES, ids=[u[0] for u in UNFIT_CANARIES])
def test_the_canary_gate_refuses_a_version_whose_window_would_be_refused_before_moving_anything(
    cataloged, seeded_bundles, case, made, code
):
    """Once the gate switched the canary replicas and moved the pointer, then failed to open
    the window: a canary serving with no window to judge it."""
    registry, _ = cataloged
    v = registry.register_adapter(seeded_bundles[1], OTHER).version.version_id
    mark_validated(registry, v, signed=False)
    made(registry, v)
    before = registry_snapshot(registry.settings, artifacts=False)
    with pytest.raises(IllegalTransition) as refused:
        deploy_canary(registry, v)
    assert (refused.value.code, refused.value.field) == (code, "version_id")
    assert registry_snapshot(registry.settings, artifacts=False) == before


def test_a_token_opens_a_window_only_within_the_cap(canaried, seeded_bundles):
    v2 = canaried.owner.register_adapter(seeded_bundles[1], NAME).version.version_id
    mark_validated(canaried.owner, v2)
    promote(canaried.owner, v2, "canary")
    refused_above_the_cap(canaried, lambda: canaried.as_["signing"].open_canary_window(v2, share=0.6))
    window, created = canaried.as_["signing"].open_canary_window(v2, share=0.5)
    assert created and window.share == 0.5


# -- the bucket key ----------------------------------------------------------------------------


def bucket_keys(registry: Registry) -> dict[int, str]:
    engine = sql_engine(registry)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(select(canary_windows.c.id, canary_windows.c.bucket_key)).all())
    finally:
        engine.dispose()


def test_each_window_has_a_random_bucket_key_that_never_leaves_the_registry(canaried, seeded_bundles):
    v2 = canaried.owner.register_adapter(seeded_bundles[1], OTHER).version.version_id
    mark_validated(canaried.owner, v2)
    promote(canaried.owner, v2, "canary")
    other, _ = canaried.owner.open_canary_window(v2)
    keys = bucket_keys(canaried.owner)
    assert set(keys) == {canaried.window_id, other.id} and len(set(keys.values())) == 2
    assert all(re.fullmatch(r"[0-9a-f]{64}", k) for k in keys.values())
    shown = json.dumps(
        [w.as_dict() for w in canaried.owner.canary_windows(None)]
        + [e.as_dict() for name in (NAME, OTHER) for e in canaried.owner.history(name)],
        default=str,
    )
    assert not any(k in shown for k in keys.values())


# -- the database's copy of the cap --------------------------------------------------------------


def test_init_copies_the_cap_into_the_database_and_audits_each_change(tmp_path, db_url):
    settings = Settings(
        home=tmp_path / "home", database_url=db_url, artifacts=str(tmp_path / "artifacts"), canary_max_share=0.3
    )
    for _ in range(2):  # the same setting again writes nothing
        with Registry.open(settings, check_schema=False) as registry:
            registry.init()
    engine = sql_engine(registry)
    try:
        with engine.connect() as conn:
            cap = conn.execute(select(registry_limits.c.canary_max_share)).scalars().all()
            changes = conn.execute(
                select(audit_events.c.from_value, audit_events.c.to_value).where(
                    audit_events.c.action == "registry_limit"
                )
            ).all()
    finally:
        engine.dispose()
    # the window thresholds init fixes beside the cap (migration 0015), each written once
    assert cap == [0.3] and [tuple(c) for c in changes] == [("0.5", "0.3"), (None, "canary_thresholds")]
