"""Who may send users where is decided by Postgres too (migration 0012).

A role's database user writes raw SQL -- the canary pool holds ``loragate_signing``, the
release pool ``loragate_activation``, the intake pool ``loragate_training``. The replicas
route users by the active canary window and its share, so the database itself holds those
users to the lifecycle's rules: a window is opened only as open, for the adapter's canary,
validated and signed by an active signing key, within the cap (``registry_limits``); its
status moves only along ``WINDOW_MOVES``; its share is raised above the cap only by the
activation user on a person's sign-off redeemed and not yet applied; a version enters as
staging, validation pending, whatever the training user writes; and each window's bucket
key is drawn by the database. Every probe runs in a transaction of its own, rolled back
unless it commits on purpose; a refusal is SQLSTATE 42501 (or the grant's own 42501).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError

from loragate.registry.rules.access import split_token
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair, key_id
from tests import test_production_signoff_in_sql as signoff_in_sql
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS, mark_validated
from tests.test_production_signoff_in_sql import APPLY, NAME, World, refused, use

pytestmark = pytest.mark.postgres
# v1 on canary with a window ready for its sign-off, v2 validated; the activation user's engine
world = signoff_in_sql.world

UNSIGNED, FAILED, REVOKED, WINDOWED = (f"acme/tiny-llama/{t}" for t in ("unsigned", "failed", "revoked", "windowed"))
HEX_64 = re.compile(r"^[0-9a-f]{64}$")
OPEN = text(
    "INSERT INTO canary_windows (adapter_name, version_id, status, opened_at, thresholds, closed_at, share, "
    "bucket_key) VALUES (:name, :v, :status, now(), '{}', CASE WHEN :closed THEN now() END, :share, :key) "
    "RETURNING id"  # a role's user reads every column but the bucket key (migration 0015)
)


@dataclass(frozen=True)
class Adapters:
    """Canaries in every state a window cares about, written as the owner; probes roll back.

    ``NAME``: ``canary`` validated, signed, no window; ``not_canary`` validated, signed, not
    the canary. ``UNSIGNED``'s canary is validated, never signed; ``FAILED``'s was signed,
    then its latest validation failed; ``REVOKED``'s is signed only by a key revoked since.
    ``WINDOWED``'s canary has an open window and a rolled-back one."""

    url: str
    canary: str
    not_canary: str
    unsigned: str
    failed: str
    revoked: str
    windowed: str
    open_window: int
    closed_window: int

    def params(self) -> dict:
        return {"open": self.open_window, "closed": self.closed_window}


@pytest.fixture(scope="module")
def adapters(pg_template, tiny_base, seeded_bundles, tmp_path_factory) -> Adapters:
    root = tmp_path_factory.mktemp("canary-rules")
    url = pg_template()
    settings = Settings(home=root / "home", database_url=url, artifacts=str(root / "artifacts"), actor="owner")
    with Registry.open(settings, principal=IN_PROCESS) as owner:
        owner.add_base(str(tiny_base), "tiny-llama")

        def canary(name: str, bundle: Path, **validated) -> str:
            version = owner.register_adapter(bundle, name).version.version_id
            mark_validated(owner, version, **validated)
            promote(owner, version, "canary")
            return version

        v1 = canary(NAME, seeded_bundles[0])
        v2 = owner.register_adapter(seeded_bundles[1], NAME).version.version_id
        mark_validated(owner, v2)
        unsigned = canary(UNSIGNED, seeded_bundles[0], signed=False)
        failed = canary(FAILED, seeded_bundles[0])
        mark_validated(owner, failed, passed=False)
        revoked = canary(REVOKED, seeded_bundles[0], signed=False)
        key = generate_key_pair()
        owner.add_signing_key(key.public_pem, "signing", "revoked-since")
        owner.sign_version(revoked, key.private_pem)
        owner.revoke_signing_key(key_id(key.public_pem))
        windowed = canary(WINDOWED, seeded_bundles[0])
        closed, _ = owner.open_canary_window(windowed)
        owner.close_canary_window(closed.id, WindowStatus.ROLLED_BACK, "rules test")
        opened, _ = owner.open_canary_window(windowed)
    return Adapters(url, v1, v2, unsigned, failed, revoked, windowed, opened.id, closed.id)


def as_user(url: str, role: str) -> Engine:
    return create_engine(make_url(url).set(username=f"loragate_{role}"))


@pytest.fixture(scope="module")
def engines(adapters) -> dict[str, Engine]:
    made = {role: as_user(adapters.url, role) for role in ("signing", "activation", "training", "replica")}
    yield made
    for engine in made.values():
        engine.dispose()


def attempt(engine: Engine, statement, params: dict) -> list:
    """``statement`` in a transaction of its own, rolled back; the rows it returned."""
    with engine.connect() as conn:
        try:
            result = conn.execute(statement, params)
            return result.all() if result.returns_rows else [result.rowcount]
        finally:
            conn.rollback()


def refused_for_privilege(engine: Engine, statement, params: dict) -> str:
    with pytest.raises(DBAPIError) as failed:
        attempt(engine, statement, params)
    assert getattr(failed.value.orig, "sqlstate", None) == "42501", failed.value
    return str(failed.value.orig)


def window(adapter: str, version: str, status: str = "open", share: float = 0.01, closed: bool = False) -> dict:
    return {"name": adapter, "v": version, "status": status, "share": share, "closed": closed, "key": "0" * 64}


# -- opening a window ------------------------------------------------------------------------

# (case, the window a role's user inserts, what the refusal names)
FORGED_WINDOWS: list[tuple[str, Callable[[Adapters], dict], str]] = [
    ("a-version-that-is-not-the-canary", lambda a: window(NAME, a.not_canary), "only for its canary"),
    ("another-adapters-canary", lambda a: window(NAME, a.windowed), "only for its canary"),
    ("an-unsigned-canary", lambda a: window(UNSIGNED, a.unsigned), "signed"),
    ("a-canary-whose-latest-validation-failed", lambda a: window(FAILED, a.failed), "validated"),
    ("a-canary-signed-only-by-a-revoked-key", lambda a: window(REVOKED, a.revoked), "signed"),
    ("opened-ready-for-its-sign-off", lambda a: window(NAME, a.canary, "ready"), "opened as open"),
    ("opened-already-closed", lambda a: window(NAME, a.canary, "rolled_back", closed=True), "opened as open"),
    ("opened-with-a-closing-time", lambda a: window(NAME, a.canary, closed=True), "opened as open"),
    ("just-above-the-cap", lambda a: window(NAME, a.canary, share=0.51), "the cap"),
    ("every-user", lambda a: window(NAME, a.canary, share=1.0), "the cap"),
]


@pytest.mark.parametrize("role", ["signing", "activation"])
@pytest.mark.parametrize(("case", "forged", "named"), FORGED_WINDOWS, ids=[f[0] for f in FORGED_WINDOWS])
def test_a_role_opens_a_window_only_for_a_validated_signed_canary_within_the_cap(
    adapters, engines, role, case, forged, named
):
    message = refused_for_privilege(engines[role], OPEN, forged(adapters))
    assert named in message, message


@pytest.mark.parametrize("role", ["signing", "activation"])
@pytest.mark.parametrize("share", [0.0, 0.01, 0.5])
def test_a_validated_signed_canary_opens_a_window_up_to_the_cap(adapters, engines, role, share):
    (key,) = drawn_keys(adapters, role, window(NAME, adapters.canary, share=share))
    assert HEX_64.match(key) and key != "0" * 64


def drawn_keys(adapters: Adapters, role: str, *opened: dict) -> list[str]:
    """The windows ``role`` opens in one transaction (each but the last superseded before the
    next), and the bucket keys the database drew for them, read back as the owner in the same
    transaction: rolled back."""
    keys = []
    owner = create_engine(adapters.url)
    try:
        with owner.connect() as conn:
            try:
                for n, params in enumerate(opened):
                    conn.execute(text(f"SET LOCAL ROLE loragate_{role}"))
                    (wid,) = conn.execute(OPEN, params).one()
                    if n < len(opened) - 1:
                        supersede = "UPDATE canary_windows SET status = 'superseded', closed_at = now() WHERE id = :w"
                        conn.execute(text(supersede), {"w": wid})
                    conn.execute(text("RESET ROLE"))
                    keys.append(
                        conn.execute(
                            text("SELECT bucket_key FROM canary_windows WHERE id = :w"), {"w": wid}
                        ).scalar_one()
                    )
            finally:
                conn.rollback()
    finally:
        owner.dispose()
    return keys


def test_the_database_draws_each_windows_bucket_key_whatever_the_inserter_writes(adapters, engines):
    """Two windows in one transaction (the first superseded): two keys, neither the one
    written; the replica's user reads them, and cannot choose one either."""
    first, second = drawn_keys(adapters, "signing", window(NAME, adapters.canary), window(NAME, adapters.canary))
    assert first != second and all(HEX_64.match(k) for k in (first, second))
    read = text("SELECT bucket_key FROM canary_windows WHERE id = :open")
    ((key,),) = attempt(engines["replica"], read, adapters.params())
    assert HEX_64.match(key)
    for role in ("replica", "signing", "activation"):
        choose = text("UPDATE canary_windows SET bucket_key = :k WHERE id = :open")
        refused_for_privilege(engines[role], choose, {**adapters.params(), "k": "0" * 64})


# -- a running window: status and share ------------------------------------------------------

# (case, statement on the open or the closed window of WINDOWED)
FORGED_UPDATES = [
    ("every-user", "UPDATE canary_windows SET share = 1.0 WHERE id = :open"),
    ("just-above-the-cap", "UPDATE canary_windows SET share = 0.51 WHERE id = :open"),
    ("a-closed-window-reopened", "UPDATE canary_windows SET status = 'open', closed_at = NULL WHERE id = :closed"),
    ("a-closed-window-made-ready", "UPDATE canary_windows SET status = 'ready', closed_at = NULL WHERE id = :closed"),
    ("an-open-window-promoted-before-ready", "UPDATE canary_windows SET status = 'promoted' WHERE id = :open"),
    ("a-closed-window-given-a-share", "UPDATE canary_windows SET share = 0.1 WHERE id = :closed"),
    ("reopened-with-every-user", "UPDATE canary_windows SET status = 'open', share = 1.0 WHERE id = :closed"),
    ("a-closed-window-made-undecided", "UPDATE canary_windows SET status = 'undecided' WHERE id = :closed"),
    # a verdict's moves: only with the evaluator's observation (tests/test_verdict_in_sql.py)
    ("made-ready-by-hand", "UPDATE canary_windows SET status = 'ready', reason = 'in band' WHERE id = :open"),
    ("made-undecided-by-hand", "UPDATE canary_windows SET status = 'undecided', closed_at = now() WHERE id = :open"),
]
ALLOWED_UPDATES = [
    ("up-to-the-cap", "UPDATE canary_windows SET share = 0.5 WHERE id = :open"),
    ("dark", "UPDATE canary_windows SET share = 0 WHERE id = :open"),
    ("rolled-back", "UPDATE canary_windows SET status = 'rolled_back', closed_at = now() WHERE id = :open"),
]


@pytest.mark.parametrize("role", ["signing", "activation"])
@pytest.mark.parametrize(("case", "statement"), FORGED_UPDATES, ids=[f[0] for f in FORGED_UPDATES])
def test_a_window_moves_only_along_its_transitions_and_within_the_cap(adapters, engines, role, case, statement):
    refused_for_privilege(engines[role], text(statement), adapters.params())


@pytest.mark.parametrize("role", ["signing", "activation"])
@pytest.mark.parametrize(("case", "statement"), ALLOWED_UPDATES, ids=[f[0] for f in ALLOWED_UPDATES])
def test_the_watchs_own_moves_still_pass(adapters, engines, role, case, statement):
    assert attempt(engines[role], text(statement), adapters.params()) == [1]


def test_a_temporary_registry_limits_does_not_lift_the_cap(adapters, engines):
    """The rules read ``public.registry_limits``: a temporary table of that name saying 1.0
    (possible in these cloned databases, see test_rules_unshadowable.py) changes nothing."""

    def shadow_and_raise(conn: Connection) -> None:
        conn.execute(text("CREATE TEMP TABLE registry_limits (id integer, canary_max_share float)"))
        conn.execute(text("INSERT INTO registry_limits VALUES (1, 1.0)"))
        conn.execute(text("UPDATE canary_windows SET share = 1.0 WHERE id = :open"), adapters.params())

    assert "the cap" in refused(engines["signing"], shadow_and_raise)


def test_the_cap_is_the_registry_limits_row_that_no_role_may_write(adapters, engines):
    read = text("SELECT canary_max_share FROM registry_limits")
    for role in ("signing", "activation", "training"):
        assert attempt(engines[role], read, {}) == [(0.5,)]
        for write in ("UPDATE registry_limits SET canary_max_share = 1.0", "DELETE FROM registry_limits"):
            refused_for_privilege(engines[role], text(write), {})


# -- every user on the canary: the promotion's step, on a person's sign-off ----------------------

SHARE_ALL = text("UPDATE canary_windows SET share = 1.0 WHERE id = :w")


def _redeemed(conn: Connection, w: World) -> None:
    use(conn, w.issue(conn, w.person))


def _revoke_reviewer(w: World) -> None:
    w.owner.revoke_token(split_token(w.person)[0])


def _outlive(w: World) -> None:
    owner = create_engine(w.owner.settings.database_url)
    with owner.begin() as conn:
        conn.execute(text("UPDATE approval_codes SET used_at = now() - interval '1 day'"))
    owner.dispose()


# (case, committed first as the activation user, then the owner, then in the raise's own
# transaction, who raises, allowed)
SIGN_OFFS: list[tuple[str, Callable | None, Callable | None, Callable | None, str, bool]] = [
    ("no-sign-off", None, None, None, "activation", False),
    ("a-code-issued-never-redeemed", lambda c, w: w.issue(c, w.person), None, None, "activation", False),
    ("a-code-redeemed", _redeemed, None, None, "activation", True),
    ("a-code-redeemed-in-the-same-transaction", None, None, _redeemed, "activation", True),
    (
        "a-code-applied-in-the-same-transaction",
        _redeemed,
        None,
        lambda c, w: c.execute(APPLY, {"v": w.v1}),
        "activation",
        True,
    ),
    (
        "a-code-applied-by-an-earlier-move",
        lambda c, w: (_redeemed(c, w), c.execute(APPLY, {"v": w.v1})),
        None,
        None,
        "activation",
        False,
    ),
    ("a-code-redeemed-by-a-reviewer-revoked-since", _redeemed, _revoke_reviewer, None, "activation", False),
    ("a-code-redeemed-longer-ago-than-it-lives", _redeemed, _outlive, None, "activation", False),
    ("a-code-redeemed-raised-by-signing", _redeemed, None, None, "signing", False),
]


@pytest.mark.parametrize(
    ("case", "committed", "by_owner", "within", "who", "allowed"), SIGN_OFFS, ids=[s[0] for s in SIGN_OFFS]
)
def test_every_user_goes_to_the_canary_only_by_activation_on_a_persons_redeemed_sign_off(
    world, case, committed, by_owner, within, who, allowed
):
    if committed is not None:
        with world.activation.begin() as conn:
            committed(conn, world)
    if by_owner is not None:
        by_owner(world)
    engine = world.activation if who == "activation" else as_user(world.owner.settings.database_url, who)

    def raise_share(conn: Connection) -> None:
        if within is not None:
            within(conn, world)
        assert conn.execute(SHARE_ALL, {"w": world.window_id}).rowcount == 1

    try:
        if allowed:
            with engine.begin() as conn:
                raise_share(conn)
        else:
            assert "sign-off" in refused(engine, raise_share)
    finally:
        if engine is not world.activation:
            engine.dispose()
    assert world.owner.canary_window(world.window_id).share == (1.0 if allowed else 0.01)


def test_the_promotion_as_the_activation_user_sends_every_user_first_then_moves(world, tmp_path):
    """The release pool's path end to end: its pipeline token and its database user, a
    person's code redeemed by the sign-off, then ``promote_canary`` -- the database takes
    the share of 1.0 and the move that applies the code."""
    from loragate.registry.db.users import role_database_url
    from loragate.registry.rules.access import Role
    from loragate.tasks.canary_moves import promote_canary

    world.owner.set_canary_share(NAME, 0.2)
    pipeline = world.owner.create_token("activation", "release-pool", pipeline=True)[1]
    url = role_database_url(world.owner.settings.database_url, Role.ACTIVATION)
    settings = world.owner.settings.model_copy(update={"database_url": url, "token": pipeline})
    reviewer = Registry.open(world.owner.settings.model_copy(update={"database_url": url, "token": world.person}))
    with Registry.open(settings) as release, reviewer:
        _, code = reviewer.issue_approval_code(world.v1)
        release.request_approval(world.window_id, "run-1")
        release.record_approval(world.window_id, approve=True, reviewer="alice", code=code, flow_run_id="run-1")
        closed, previous, _ = promote_canary(release, world.v1, "signed off")
    assert closed.status == WindowStatus.PROMOTED and previous is None
    shares = [e.to_value for e in world.owner.history(NAME) if e.action == "canary_share"]
    assert shares == ["0.2", "1.0"]
    assert world.owner.get_adapter(NAME).production == world.v1


# -- a new version enters as staging ---------------------------------------------------------

VERSION_COLUMNS = (
    "adapter_id, identity_sha256, manifest_sha256, weights_sha256, weights_size, adapter_config_sha256, "
    "base_model_id, base_model_commit, lora_rank, manifest, created_by"
)
FORGE_VERSION = text(
    f"INSERT INTO adapter_versions (version_id, content_address, {VERSION_COLUMNS}, stage, validation_status, "
    "previous_version, created_at) "
    f"SELECT 'forged', 'sha256:' || repeat('f', 64), {VERSION_COLUMNS}, :stage, :validation, version_id, now() "
    "FROM adapter_versions WHERE version_id = :head RETURNING stage, validation_status"
)


@pytest.mark.parametrize(
    ("stage", "validation"),
    [("production", "passed"), ("canary", "passed"), ("staging", "passed"), ("retired", "failed")],
)
def test_a_version_the_training_user_inserts_enters_as_staging_pending_whatever_it_writes(
    adapters, engines, stage, validation
):
    inserted = attempt(
        engines["training"], FORGE_VERSION, {"stage": stage, "validation": validation, "head": adapters.not_canary}
    )
    assert inserted == [("staging", "pending")]
