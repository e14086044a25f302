"""The Postgres roles of migration 0006 (and 0010's fleet, 0014's pins): a process holding one
loragate role's database credentials can do that role's writes and nothing else.

The matrix runs one statement per case as each role's database user against a real
populated registry, each in its own transaction that is rolled back: an allowed statement
must succeed outright (its values are real, so no CHECK or foreign key stands in for a
grant), a denied one must fail with insufficient privilege (SQLSTATE 42501), whatever
triggers would say afterwards. Then the application itself runs as each database user:
the grants must cover every write the role's real code paths make, and a write beyond
them must surface as PermissionDenied and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg.errors
import pytest
from sqlalchemy import create_engine, func, insert, inspect, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError

from kit.tenant_tasks import write_golden_set
from loragate.registry.db import migrate
from loragate.registry.db.schema import adapter_pins, adapters, approval_codes, metadata
from loragate.registry.db.store import make_engine
from loragate.registry.db.users import role_database_url
from loragate.registry.errors import PermissionDenied
from loragate.registry.rules.access import Role
from loragate.registry.rules.approvals import issue_code
from loragate.registry.rules.canary import Observation, SideStats, Verdict, WindowStatus
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair, key_id
from tests.support.db_role_matrix import MATRIX, ROLES
from tests.support.moves import promote, rollback
from tests.support.registries import IN_PROCESS, mark_validated, registry_snapshot

pytestmark = pytest.mark.postgres

NAME = "acme/tiny-llama/support"
# registered but never used to sign: the signature case inserts one with it
SPARE_KEY = generate_key_pair()
REVIEWER = "reviewer"  # holds an activation token: a production sign-off needs one
# adapters without versions beside NAME (a person's pin): one pinned hot, one not pinned
# of the spare base, whose production replica gives hot pins room (the limit, migration 0016)
HOT_NAME = "acme/spare-llama/hot"
FREE_NAME = "acme/spare-llama/free"
SIDE = SideStats(20, 0, 50.0, 100.0)


def db_user_url(url: str, role: str) -> str:
    """``url`` with the database user of ``role`` (no password: the test server trusts local users)."""
    found = role_database_url(url, Role(role))
    assert found is not None
    return found


@dataclass(frozen=True)
class Populated:
    """A registry on Postgres written through the application as the database owner: the
    tiny base pinned, ``v1`` validated, signed, in canary with an open window and one
    observation, a golden set, a replica, a token and a spare signing key."""

    root: Path
    url: str  # as the owner
    v1: str
    adapter_id: int
    run_id: int
    window_id: int
    token_id: str
    base_commit: str
    reviewer_token: str = field(repr=False)

    def settings(self, role: str | None = None) -> Settings:
        url = self.url if role is None else db_user_url(self.url, role)
        return Settings(
            home=self.root / "home", database_url=url, artifacts=str(self.root / "artifacts"), actor=role or "owner"
        )

    def open(self, role: str | None = None) -> Registry:
        """The application connected as ``role``'s database user (the owner when None),
        holding every application role: only the database says no."""
        return Registry.open(self.settings(role), principal=IN_PROCESS)

    def params(self) -> dict:
        return {
            "v": self.v1,
            "name": NAME,
            "adapter_id": self.adapter_id,
            "run_id": self.run_id,
            "window_id": self.window_id,
            "token_id": self.token_id,
            "spare_key": key_id(SPARE_KEY.public_pem),
            "base_commit": self.base_commit,
            "hot_name": HOT_NAME,
            "free_name": FREE_NAME,
        }


def observation(window_id: int, verdict: Verdict) -> Observation:
    return Observation(window_id, datetime.now(UTC), SIDE, SIDE, 0.0, [], verdict, [], ["roles test"])


def populate(url: str, root: Path, tiny_base: Path, bundle: Path) -> Populated:
    settings = Settings(home=root / "home", database_url=url, artifacts=str(root / "artifacts"), actor="owner")
    with Registry.open(settings, principal=IN_PROCESS) as registry:
        base, _ = registry.add_base(str(tiny_base), "tiny-llama")
        v1 = registry.register_adapter(bundle, NAME).version.version_id
        registry.attach_golden_set(NAME, write_golden_set("support", root / "golden.jsonl"))
        run = mark_validated(registry, v1)
        registry.add_signing_key(SPARE_KEY.public_pem, "signing", "spare")
        promote(registry, v1, "canary")
        window, _ = registry.open_canary_window(v1)
        registry.record_canary_observation(observation(window.id, Verdict.CONTINUE))
        # a replica in the fleet for the roles that manage it, of another base: the adapter's
        # pointer moves below switch no replica (a dead one would refuse them)
        registry.add_base(str(tiny_base), "spare-llama")
        registry.add_replica("http://127.0.0.1:9", "spare-llama", "canary", str(root / "replica-adapters"))
        registry.add_replica("http://127.0.0.1:8", "spare-llama", "production", str(root / "replica-adapters"))
        token, reviewer_token = registry.create_token("activation", REVIEWER)
        registry.pin(NAME)
    engine = make_engine(settings.database)
    try:
        with engine.begin() as conn:
            for name in (HOT_NAME, FREE_NAME):
                conn.execute(
                    insert(adapters).values(
                        name=name,
                        namespace="acme",
                        base="spare-llama",
                        task=name.rsplit("/", 1)[1],
                        created_at=datetime.now(UTC),
                    )
                )
            conn.execute(insert(adapter_pins).values(adapter_name=HOT_NAME, source="hot", pinned_by="owner"))
            # a code issued for the window, as the owner: the application issues one only for
            # a window ready for sign-off, and this one stays open for the cases below
            issued = issue_code()
            conn.execute(
                insert(approval_codes).values(
                    code_id=issued.code_id,
                    secret_sha256=issued.secret_hash,
                    window_id=window.id,
                    version_id=v1,
                    adapter_name=NAME,
                    token_id=token.token_id,
                    reviewer=REVIEWER,
                    decision="approve",
                    issued_at=datetime.now(UTC),
                    expires_at=datetime.now(UTC),
                )
            )
        with engine.connect() as conn:
            adapter_id = conn.execute(select(adapters.c.id).where(adapters.c.name == NAME)).scalar_one()
            empty = [
                t.name for t in metadata.sorted_tables if not conn.execute(select(func.count()).select_from(t)).scalar()
            ]
    finally:
        engine.dispose()
    assert empty == [], f"the fixture leaves tables without rows: {empty}"
    return Populated(
        root, url, v1, adapter_id, run.id, window.id, token.token_id, base.base_model_commit, reviewer_token
    )


@pytest.fixture(scope="module")
def shared(pg_template, tiny_base, seeded_bundles, tmp_path_factory) -> Populated:
    """One populated registry for the matrix: every probe there is rolled back."""
    return populate(pg_template(), tmp_path_factory.mktemp("roles"), tiny_base, seeded_bundles[0])


@pytest.fixture(scope="module")
def engines(shared) -> dict[str, Engine]:
    made = {role: create_engine(db_user_url(shared.url, role)) for role in ROLES}
    yield made
    for engine in made.values():
        engine.dispose()


@pytest.fixture
def fresh(pg_template, tiny_base, seeded_bundles, tmp_path) -> Populated:
    """A populated registry of the test's own, for the application's real writes."""
    return populate(pg_template(), tmp_path, tiny_base, seeded_bundles[0])


def insufficient_privilege(error: BaseException) -> bool:
    cause = error.orig if isinstance(error, DBAPIError) else error.__cause__
    return isinstance(cause, psycopg.errors.InsufficientPrivilege) or getattr(cause, "sqlstate", None) == "42501"


def attempt(engine: Engine, statement: str, params: dict) -> int:
    """Run ``statement`` in a transaction of its own and roll it back; returns the rows it
    touched."""
    with engine.connect() as conn:
        try:
            return conn.execute(text(statement), params).rowcount
        finally:
            conn.rollback()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("case", "statement", "allowed"), MATRIX, ids=[m[0] for m in MATRIX])
def test_each_database_role_may_make_exactly_its_own_writes(shared, engines, case, statement, allowed, role):
    if role in allowed:
        # a row really read or written: an UPDATE matching nothing would prove no grant
        assert attempt(engines[role], statement, shared.params()) > 0, f"{case} as {role} touched no row"
        return
    with pytest.raises(DBAPIError) as refused:
        attempt(engines[role], statement, shared.params())
    assert insufficient_privilege(refused.value), f"{case} as {role} failed for another reason: {refused.value}"


def test_every_database_role_reads_every_table(shared, engines):
    for role, engine in engines.items():
        with engine.connect() as conn:
            for table in metadata.sorted_tables:
                assert conn.execute(select(func.count()).select_from(table)).scalar() > 0, (role, table.name)


# refused by a trigger even for the owner, who holds every grant
OWNER_REFUSED = ["rewrite-the-audit-log", "erase-the-audit-log", "rewrite-a-manifest", "delete-a-version"]


@pytest.mark.parametrize("case", OWNER_REFUSED)
def test_history_is_refused_to_the_owner_by_triggers(shared, case):
    statement = next(s for c, s, _ in MATRIX if c == case)
    owner = create_engine(shared.url)
    try:
        with pytest.raises(DBAPIError, match="immutable") as refused:
            attempt(owner, statement, shared.params())
        assert not insufficient_privilege(refused.value)
    finally:
        owner.dispose()


def test_training_registers_through_the_application_but_cannot_promote(fresh, seeded_bundles, tmp_path):
    with fresh.open("training") as training:
        result = training.register_adapter(seeded_bundles[1], NAME)
        v2 = result.version.version_id
        assert result.created and result.version.previous_version == fresh.v1
        training.attach_golden_set(NAME, write_golden_set("tickets", tmp_path / "tickets.jsonl"))
    with fresh.open() as owner:
        mark_validated(owner, v2)
        before = registry_snapshot(fresh.settings(), artifacts=False)
    with fresh.open("training") as training, pytest.raises(PermissionDenied, match="loragate_training"):
        promote(training, v2, "canary")
    assert registry_snapshot(fresh.settings(), artifacts=False) == before


def test_signing_validates_signs_opens_and_withdraws_a_canary_but_cannot_judge_it_or_register(fresh, seeded_bundles):
    with fresh.open() as owner:
        v2 = owner.register_adapter(seeded_bundles[1], NAME).version.version_id
    with fresh.open("signing") as signing:
        mark_validated(signing, v2)  # records the run, then signs it with the registered key
        assert [s.validation_run_id for s in signing.signatures(v2)] == [signing.validation_runs(v2)[-1].id]
        promote(signing, v2, "canary")  # the pointer exists: its upsert takes the UPDATE branch
        assert signing.resolve_stage(NAME, "canary") == v2
        window, created = signing.open_canary_window(v2)  # supersedes v1's window
        assert created and signing.canary_window(fresh.window_id).status == WindowStatus.SUPERSEDED
        with pytest.raises(PermissionDenied, match="loragate_signing"):
            signing.record_canary_observation(observation(window.id, Verdict.READY))
        assert signing.canary_window(window.id).status == WindowStatus.OPEN
        assert not signing.canary_observations(window.id)
        rollback(signing, NAME, "canary")  # deletes the pointer
        signing.close_canary_window(window.id, WindowStatus.ROLLED_BACK, "roles test")
        assert signing.get_version(v2).stage == "rolled_back" and signing.get_adapter(NAME).canary is None
        before = registry_snapshot(fresh.settings(), artifacts=False)
        with pytest.raises(PermissionDenied):
            signing.register_adapter(seeded_bundles[2], NAME)
    assert registry_snapshot(fresh.settings(), artifacts=False) == before


def test_activation_judges_signs_off_and_promotes_to_production_but_cannot_record_a_validation(fresh):
    with fresh.open("activation") as activation:
        activation.record_canary_observation(observation(fresh.window_id, Verdict.READY))  # the evaluator's function
        assert activation.canary_window(fresh.window_id).status == WindowStatus.READY
        activation.request_approval(fresh.window_id, "flow-run-1")
        reviewer = Registry.open(fresh.settings("activation").model_copy(update={"token": fresh.reviewer_token}))
        with reviewer:
            _, code = reviewer.issue_approval_code(fresh.v1)
        activation.record_approval(
            fresh.window_id, approve=True, reviewer=REVIEWER, code=code, flow_run_id="flow-run-1"
        )
        promote(activation, fresh.v1, "production")
        activation.close_canary_window(fresh.window_id, WindowStatus.PROMOTED, "signed off")
        assert activation.resolve_stage(NAME, "production") == fresh.v1
        before = registry_snapshot(fresh.settings(), artifacts=False)
        with pytest.raises(PermissionDenied):
            mark_validated(activation, fresh.v1, signed=False)
    assert registry_snapshot(fresh.settings(), artifacts=False) == before


def test_admin_manages_bases_fleet_pins_tokens_and_keys_but_cannot_promote(fresh, tiny_base, tmp_path):
    with fresh.open("admin") as admin:
        _, pinned = admin.add_base(str(tiny_base), "tiny-llama-copy")
        assert pinned
        admin.add_replica("http://127.0.0.1:11", "tiny-llama", "production", str(tmp_path / "replica"))
        admin.remove_replica("http://127.0.0.1:9")
        token, _ = admin.create_token("training", "admin-tests")
        admin.revoke_token(token.token_id)
        key = generate_key_pair()
        admin.add_signing_key(key.public_pem, "activation", "admin-tests")
        admin.revoke_signing_key(key_id(key.public_pem))
        assert admin.pin(HOT_NAME)[1] and admin.unpin(NAME).name == NAME  # a hot pin made a person's
        before = registry_snapshot(fresh.settings(), artifacts=False)
        with pytest.raises(PermissionDenied):
            promote(admin, fresh.v1, "production")
    assert registry_snapshot(fresh.settings(), artifacts=False) == before


def test_fleet_reconciles_and_pins_hot_but_adds_no_replica_mints_no_token_and_moves_no_pointer(fresh, tmp_path):
    """What the fleet pool's worker connects as: reconcile holding each adapter's row, the
    hot pins replaced; which replicas there are is a person's (migration 0016: the grant is
    gone, the raw SQL is in the role matrix), and a token (which a person's activation token
    would be), a person's pin or a pointer move is refused by the database itself, whatever
    the application was told."""
    from loragate.tasks.reconcile import reconcile_fleet

    with fresh.open("fleet") as fleet:
        with pytest.raises(PermissionDenied, match="permission denied for table replicas"):
            fleet.add_replica("http://127.0.0.1:11", "tiny-llama", "production", str(tmp_path / "replica"))
        with pytest.raises(PermissionDenied, match="permission denied for table replicas"):
            fleet.remove_replica("http://127.0.0.1:9")
        with fleet.holding_adapter(NAME) as held:
            assert held is not None and held.canary == fresh.v1
        states = reconcile_fleet(fleet)  # nothing listens at :8 or :9: unreachable, and nothing refused
        assert sorted((s.replica.url, s.reachable) for s in states) == [
            ("http://127.0.0.1:8", False),
            ("http://127.0.0.1:9", False),
        ]
        assert fleet.replace_hot_pins([NAME, FREE_NAME]) == ([FREE_NAME], [HOT_NAME])  # NAME stays a person's
        before = registry_snapshot(fresh.settings(), artifacts=False)
        with pytest.raises(PermissionDenied, match="loragate_fleet"):
            fleet.unpin(NAME)
        with pytest.raises(PermissionDenied, match="loragate_fleet"):
            fleet.create_token("activation", "mallory")
        with pytest.raises(PermissionDenied, match="loragate_fleet"):
            rollback(fleet, NAME, "canary")
    assert registry_snapshot(fresh.settings(), artifacts=False) == before


def test_downgrade_revokes_the_grants_and_upgrade_restores_them(pg_template, tiny_base, seeded_bundles, tmp_path):
    url = pg_template()
    owner = make_engine(make_url(url))
    training = create_engine(db_user_url(url, "training"))
    try:
        migrate.downgrade(owner, "0005")
        assert "api_tokens" not in inspect(owner).get_table_names()
        with pytest.raises(DBAPIError) as refused:
            attempt(training, "SELECT * FROM adapter_versions", {})
        assert insufficient_privilege(refused.value)
        migrate.upgrade(owner)
        assert migrate.current_revision(owner) == migrate.HEAD
    finally:
        owner.dispose()
        training.dispose()
    # the roles work again, end to end: populated as the owner, then written as training
    populated = populate(url, tmp_path, tiny_base, seeded_bundles[0])
    with populated.open("training") as registry:
        assert registry.register_adapter(seeded_bundles[1], NAME).created
        with pytest.raises(PermissionDenied):
            promote(registry, populated.v1, "production")
