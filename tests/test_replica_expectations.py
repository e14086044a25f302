"""A volume writer cannot forge what a replica expects: the resolver plugin takes the digests
and the permission from the registry's database (read-only), never from the index on the
volume, which says only where a version lies. SQLite (the file opened read-only) and
Postgres (as ``loragate_replica``, which reads no secret and writes nothing) alike, with
the plugin's own reader, outside vLLM; tests/test_replica_admin.py drives real replicas."""

from __future__ import annotations

import hashlib
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from loragate.local.replica_secrets import replica_registry_url, write_replica_secrets
from loragate.registry.db.schema import approval_codes
from loragate.registry.errors import PermissionDenied
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.rules.fleet import version_path
from loragate.registry.storage.resolver_index import INDEX_FORMAT, index_entry, write_index
from tests import test_approvals
from tests.support.moves import promote
from tests.support.registries import sql_engine
from tests.test_approvals import NAME

# test_approvals' fixture: a version on canary, its window ready, its sign-off pending
signoff = test_approvals.signoff

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "infra" / "vllm_plugin"
if str(PLUGIN_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGIN_DIR))
import loragate_resolver  # noqa: E402
from loragate_resolver import registry_reader  # noqa: E402


def _secrets(tmp_path: Path, registry) -> str:
    url = replica_registry_url(registry.settings.database_url)
    return str(write_replica_secrets(tmp_path / "replica-secrets", "k" * 32, url))


def _place(registry, adapter_dir: Path, role: str, version: str) -> str:
    """The version's copy where the fleet puts it, and the index naming it for ``role`` --
    as any writer of the volume could write it."""
    path = version_path(str(adapter_dir), NAME, version)
    if not Path(path).exists():
        registry.materialize(version, Path(path))
    write_index(
        str(adapter_dir),
        {"format": INDEX_FORMAT, "roles": {role: {NAME: index_entry(version, path, registry.bundle_digests(version))}}},
    )
    return path


def _lookup(adapter_dir: Path, role: str, secrets: str, owner_moves: bool = False):
    return loragate_resolver.lookup(
        str(adapter_dir), role, NAME, loragate_resolver.registry_expectations(role, secrets, owner_moves)
    )


def test_a_production_replica_serves_a_canaried_version_only_once_a_person_signed_it_off(signoff, tmp_path):
    owner, adapters = signoff.owner, tmp_path / "adapters"
    secrets = _secrets(tmp_path, owner)
    path = _place(owner, adapters, "production", signoff.v1)
    # the canary pool moved v1 to canary and may write the index: production still refuses
    assert _lookup(adapters, "production", secrets) is None
    assert _lookup(adapters, "canary", secrets) is None  # the index names it for production only
    _place(owner, adapters, "canary", signoff.v1)
    assert _lookup(adapters, "canary", secrets) == (signoff.v1, path)
    # a person's code, redeemed by the promote flow and not yet applied: the move in flight
    signoff.record(signoff.code())
    _place(owner, adapters, "production", signoff.v1)
    assert _lookup(adapters, "production", secrets) == (signoff.v1, path)


def test_an_index_entry_naming_a_validated_but_unapproved_version_is_refused_on_production(signoff, tmp_path):
    owner, adapters = signoff.owner, tmp_path / "adapters"
    secrets = _secrets(tmp_path, owner)
    path = _place(owner, adapters, "production", signoff.v2)  # validated, in staging
    assert _lookup(adapters, "production", secrets) is None
    # what the canary pool could serve through the database anyway: a canary promotion in flight
    _place(owner, adapters, "canary", signoff.v2)
    assert _lookup(adapters, "canary", secrets) == (signoff.v2, path)
    # the registry's owner moving production in process (tests, one machine), opted into by
    # the replica process: production takes only the canary, so v2 stays refused and v1, the
    # canary, is served
    _place(owner, adapters, "production", signoff.v2)
    assert _lookup(adapters, "production", secrets, owner_moves=True) is None
    v1_path = _place(owner, adapters, "production", signoff.v1)
    assert _lookup(adapters, "production", secrets, owner_moves=True) == (signoff.v1, v1_path)
    assert _lookup(adapters, "production", secrets) is None  # a process started without it


def test_a_copy_whose_weights_and_index_digest_were_both_rewritten_is_refused(signoff, tmp_path):
    owner, adapters = signoff.owner, tmp_path / "adapters"
    secrets = _secrets(tmp_path, owner)
    path = _place(owner, adapters, "canary", signoff.v1)
    assert _lookup(adapters, "canary", secrets) == (signoff.v1, path)
    weights = Path(path) / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")

    forged = {**owner.bundle_digests(signoff.v1), weights.name: hashlib.sha256(weights.read_bytes()).hexdigest()}
    write_index(
        str(adapters), {"format": INDEX_FORMAT, "roles": {"canary": {NAME: index_entry(signoff.v1, path, forged)}}}
    )
    assert _lookup(adapters, "canary", secrets) is None


def test_a_version_is_served_under_its_adapters_name_or_a_probes_never_another_adapters(
    signoff, seeded_bundles, tmp_path
):
    owner, adapters = signoff.owner, tmp_path / "adapters"
    path = _place(owner, adapters, "canary", signoff.v1)
    expect = loragate_resolver.registry_expectations("canary", _secrets(tmp_path, owner))
    assert loragate_resolver.verified(str(adapters), NAME, path, expect) == signoff.v1
    # a name no adapter has (a benchmark's probe): the same approved bytes, no one else's name
    assert loragate_resolver.verified(str(adapters), "acme/tiny-llama/other", path, expect) == signoff.v1
    owner.register_adapter(seeded_bundles[2], "acme/tiny-llama/other")
    assert loragate_resolver.verified(str(adapters), "acme/tiny-llama/other", path, expect) is None
    # no registry to ask: nothing is served
    no_registry = loragate_resolver.registry_expectations("canary", str(tmp_path / "nowhere"))
    assert loragate_resolver.verified(str(adapters), NAME, path, no_registry) is None


NOW = datetime(2026, 11, 27, tzinfo=UTC)
SOON, GONE = NOW + timedelta(minutes=5), NOW - timedelta(seconds=1)
# (role, validation, production or previous pointer, canary pointer, code expires, owner moves, may serve)
RULES = [
    ("production", "passed", 1, 0, None, False, True),  # production, or previous: a rollback in flight
    ("production", "passed", 0, 1, None, False, False),  # the canary: the canary pool's choice
    ("production", "passed", 0, 0, None, False, False),  # validated, no one signed it off
    ("production", "passed", 0, 1, SOON, False, True),  # a person's sign-off, redeemed, not yet applied
    ("production", "passed", 0, 1, GONE, False, False),  # ... expired
    ("production", "passed", 0, 1, None, True, True),  # the owner's move, where the operator opted in
    ("production", "passed", 0, 0, None, True, False),  # ... production takes only the canary
    ("canary", "passed", 0, 1, None, False, True),
    ("canary", "passed", 1, 0, None, False, True),
    ("canary", "passed", 0, 0, None, False, True),  # a canary promotion in flight
    ("canary", "failed", 0, 0, None, False, False),
    ("canary", "pending", 0, 0, None, True, False),
    ("canary", "failed", 0, 0, SOON, False, True),  # what production may serve, canary may too
]


@pytest.mark.parametrize("rule", RULES, ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_which_versions_each_role_may_serve(rule):
    role, validation, pointed, canary, code_expires, owner_moves, allowed = rule
    got = registry_reader.may_serve(role, validation, pointed, canary, code_expires, owner_moves, now=NOW)
    assert got is allowed


# (production or previous pointer, canary pointer, active canary windows of the version, served as name@version)
QUALIFIED = [
    (1, 0, 0, True),  # production, or previous: warm for a rollback that only moves traffic
    (0, 1, 1, True),  # the canary while its window splits traffic
    (0, 1, 0, False),  # the canary with no live window: nobody is to be sent there
    (0, 0, 1, False),  # a window for a version that is not the canary (once any signing user's insert)
    (0, 0, 0, False),
]


@pytest.mark.parametrize("rule", QUALIFIED)
def test_a_qualified_name_is_served_only_for_production_previous_or_the_canary_with_a_live_window(rule):
    pointed, canary, windows, allowed = rule
    assert registry_reader.may_serve_qualified(pointed, canary, windows) is allowed


def test_a_window_the_registry_holds_for_a_version_that_is_not_the_canary_opens_no_qualified_name(signoff, tmp_path):
    """Once the replica served ``name@version`` for any version with an active window, so a
    window row a signing user wrote for an unvalidated version sent users there."""
    owner, adapters = signoff.owner, tmp_path / "adapters"
    secrets = _secrets(tmp_path, owner)
    path = version_path(str(adapters), NAME, signoff.v2)
    owner.materialize(signoff.v2, Path(path))
    expect = loragate_resolver.registry_expectations("production", secrets)
    owner.close_canary_window(signoff.window_id, WindowStatus.ROLLED_BACK, "a test moves the window to v2")
    engine = create_engine(owner.settings.database_url)
    with engine.begin() as conn:  # as the registry's owner: the only writer the database does not check
        conn.execute(
            text(
                "INSERT INTO canary_windows (adapter_name, version_id, status, opened_at, thresholds, share) "
                "VALUES (:n, :v, 'open', CURRENT_TIMESTAMP, '{}', 1.0)"
            ),
            {"n": NAME, "v": signoff.v2},
        )
    engine.dispose()
    assert loragate_resolver.lookup(str(adapters), "production", f"{NAME}@{signoff.v2}", expect) is None


def test_the_split_routes_a_window_only_while_its_version_is_the_canary(signoff, tmp_path):
    """The registry ends a window in the move that takes its canary away; a raw write that
    moved the pointer alone leaves the window's row active, and the split routes nobody there."""
    owner = signoff.owner
    secrets = _secrets(tmp_path, owner)
    assert [(w[0], w[2]) for w in registry_reader.routes(secrets)[1]] == [(signoff.window_id, signoff.v1)]
    with sql_engine(owner).begin() as conn:  # as the registry's owner, behind the registry's back
        conn.execute(text("DELETE FROM stage_pointers WHERE stage = 'canary'"))
    assert owner.canary_window(signoff.window_id).status == WindowStatus.READY
    assert registry_reader.routes(secrets)[1] == []


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT secret_sha256 FROM approval_codes",
        "SELECT secret_sha256 FROM api_tokens",
        "SELECT manifest FROM adapter_versions",
        "SELECT * FROM audit_events",
        "UPDATE adapter_versions SET stage = 'production'",
        "DELETE FROM stage_pointers",
        "INSERT INTO adapters (name, namespace, base, task, created_at) VALUES ('x/y/z', 'x', 'y', 'z', now())",
        "UPDATE approval_codes SET used_at = now()",
    ],
)
def test_the_replica_database_user_reads_no_secret_and_writes_nothing(pg_template, statement):
    engine = create_engine(make_url(pg_template()).set(username="loragate_replica"))
    try:
        with engine.connect() as conn:
            for query in (
                registry_reader.QUERY,
                registry_reader.CODES_QUERY,
                registry_reader.NAME_QUERY,
                registry_reader.WINDOW_QUERY,
                registry_reader.PRODUCTION_ROUTES_QUERY,
                registry_reader.WINDOW_ROUTES_QUERY,
            ):
                assert conn.execute(text(query.replace("?", ":v")), {"v": "none"}).fetchall() in ([], [(0,)])
            with pytest.raises(ProgrammingError) as refused:
                conn.execute(text(statement))
            assert refused.value.orig.sqlstate == "42501"  # insufficient_privilege
    finally:
        engine.dispose()


def test_owner_moves_is_the_replica_processs_own_flag_never_a_file_of_the_shared_secrets(signoff, tmp_path):
    """Once ``owner-moves`` was a file of the secrets directory every replica reads: one
    ``replicas up --owner-moves`` (or a benchmark) widened every running replica."""
    owner, adapters = signoff.owner, tmp_path / "adapters"
    secrets = _secrets(tmp_path, owner)
    assert sorted(p.name for p in Path(secrets).iterdir()) == ["admin-key", "feedback-key", "registry-url"]
    (Path(secrets) / "owner-moves").write_text("1")  # what a writer of the directory once did
    path = _place(owner, adapters, "production", signoff.v1)  # v1, the canary
    assert _lookup(adapters, "production", secrets) is None
    assert _lookup(adapters, "production", secrets, owner_moves=True) == (signoff.v1, path)


def test_a_persons_own_promotion_is_servable_on_a_strict_production_replica_while_its_switch_loads(
    signoff, tmp_path, monkeypatch
):
    """A fleet started without owner-moves admits a version on production by a pointer or a
    person's redeemed code. The switch loads before the move commits; a person's own move
    once made its code inside that uncommitted transaction, so every replica refused the
    load and the promotion was put back (the README's tour failed on ``replicas up``)."""
    import loragate.tasks.fleet

    adapters = tmp_path / "adapters"
    secrets = _secrets(tmp_path, signoff.owner)
    path = _place(signoff.owner, adapters, "production", signoff.v1)
    assert _lookup(adapters, "production", secrets) is None  # signed off by no one yet
    seen_by_the_replica = []
    # what each production replica is asked while the fleet switch runs under the lock
    monkeypatch.setattr(
        loragate.tasks.fleet.FleetSwitch,
        "apply",
        lambda switch, plan: seen_by_the_replica.append(_lookup(adapters, "production", secrets)) or [],
    )

    promote(signoff.as_["alice"], signoff.v1, "production")

    assert seen_by_the_replica == [(signoff.v1, path)]
    assert signoff.owner.get_adapter(NAME).production == signoff.v1
    (move,) = [e for e in signoff.events("promote") if e.stage == "production"]
    with sql_engine(signoff.owner).connect() as conn:
        codes = conn.execute(approval_codes.select().where(approval_codes.c.version_id == signoff.v1)).all()
    # one code: the sign-off committed ahead is the one the move applied
    assert [(c.code_id, c.reviewer, c.applied_at is not None) for c in codes] == [
        (move.details["approval_code"], "alice", True)
    ]


def test_a_pipeline_tokens_production_move_is_not_signed_off_ahead(signoff, tmp_path):
    """Only a person's own move commits a sign-off before it: a pipeline token's refused move
    leaves nothing a production replica would take."""
    adapters = tmp_path / "adapters"
    secrets = _secrets(tmp_path, signoff.owner)
    _place(signoff.owner, adapters, "production", signoff.v1)
    with pytest.raises(PermissionDenied):
        promote(signoff.as_["pipeline"], signoff.v1, "production")
    assert _lookup(adapters, "production", secrets) is None
