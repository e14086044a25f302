"""Who may do what, in the application: every mutating operation × every role, on a real
registry; a denial is ``PermissionDenied`` (exit 3 from the CLI) and changes nothing.

The same separation at the database is tests/test_db_roles.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kit.tenant_tasks import write_golden_set
from loragate.registry.errors import ErrorCode, InvalidInput, PermissionDenied
from loragate.registry.rules.access import PERMISSIONS, Action, Principal, Role, issue_token, split_token
from loragate.registry.service import Registry
from loragate.registry.storage.signing import generate_key_pair
from tests.support.moves import promote, rollback
from tests.support.registries import (
    IN_PROCESS,
    SIGNING_KEY,
    mark_validated,
    open_sqlite_registry,
    registry_snapshot,
    sign,
)

NAME = "acme/tiny-llama/support"
ALL = frozenset(Role)


@dataclass
class World:
    """A registry with something to act on: v2 in production (v1 before it), v3 the canary,
    v4 validated and signed in staging; a replica in the fleet, of another base: the
    adapter's moves switch no replica, and a role that may move its pointers does."""

    registry: Registry
    versions: list[str]
    tmp: Path
    base: str
    victim: str  # a token to revoke


@pytest.fixture(params=["sqlite"])
def world(request, tmp_path, tiny_base, seeded_bundles) -> World:
    registry = open_sqlite_registry(tmp_path)
    registry.add_base(str(tiny_base), "tiny-llama")
    versions = [registry.register_adapter(b, NAME).version.version_id for b in seeded_bundles]
    for v in versions:
        mark_validated(registry, v)
    for v in versions[:2]:
        promote(registry, v, "canary")
        promote(registry, v, "production")
    promote(registry, versions[2], "canary")
    registry.add_base(str(tiny_base), "spare-llama")
    registry.add_replica("http://127.0.0.1:9", "spare-llama", "canary", str(tmp_path / "adapters"))
    victim = registry.create_token("training", "victim")[0].token_id
    yield World(registry, versions, tmp_path, str(tiny_base), victim)
    registry.close()


# operation -> (what it does, given the world and a registry acting as one role)
OPERATIONS: dict[str, tuple[Action, Callable[[World, Registry], object]]] = {
    "register": (Action.REGISTER, lambda w, r: r.register_adapter(w.tmp / "fresh", NAME)),
    "attach golden set": (
        Action.REGISTER,
        lambda w, r: r.attach_golden_set(NAME, write_golden_set("support", w.tmp / "golden.jsonl")),
    ),
    "record validation": (Action.VALIDATE, lambda w, r: mark_validated(r, w.versions[3], signed=False)),
    "sign": (Action.SIGN, lambda w, r: r.sign_version(w.versions[3], SIGNING_KEY.private_pem)),
    "promote to canary": (Action.PROMOTE_CANARY, lambda w, r: promote(r, w.versions[3], "canary")),
    "promote to production": (Action.PROMOTE_PRODUCTION, lambda w, r: promote(r, w.versions[2], "production")),
    "roll back production": (Action.ROLLBACK_PRODUCTION, lambda w, r: rollback(r, NAME, "production")),
    "withdraw the canary": (Action.WITHDRAW_CANARY, lambda w, r: rollback(r, NAME, "canary")),
    "open a canary window": (Action.WATCH_CANARY, lambda w, r: r.open_canary_window(w.versions[2])),
    "pin a base": (Action.MANAGE_BASES, lambda w, r: r.add_base(w.base, "tiny-llama-2")),
    "add a replica": (
        Action.MANAGE_REPLICAS,
        lambda w, r: r.add_replica("http://127.0.0.1:8", "tiny-llama", "production", str(w.tmp / "a")),
    ),
    "remove a replica": (Action.MANAGE_REPLICAS, lambda w, r: r.remove_replica("http://127.0.0.1:9")),
    "pin an adapter": (Action.PIN_ADAPTERS, lambda w, r: r.pin(NAME)),
    # the empty set: this world's base has no production replica, so no room for a hot pin
    "replace the hot pins": (Action.MANAGE_FLEET, lambda w, r: r.replace_hot_pins([])),
    "create a token": (Action.MANAGE_TOKENS, lambda w, r: r.create_token("training", "someone")),
    "list tokens": (Action.MANAGE_TOKENS, lambda w, r: r.list_tokens()),
    "revoke a token": (Action.MANAGE_TOKENS, lambda w, r: r.revoke_token(w.victim)),
    "add a signing key": (
        Action.MANAGE_KEYS,
        lambda w, r: r.add_signing_key(generate_key_pair().public_pem, "signing", "carol"),
    ),
    "collect garbage": (Action.COLLECT_GARBAGE, lambda w, r: r.gc(dry_run=True)),
}
# what the issue specifies, written out: the table in registry/access.py must say the same
ALLOWED = {
    "register": {Role.TRAINING},
    "attach golden set": {Role.TRAINING},
    "record validation": {Role.SIGNING},
    "sign": {Role.SIGNING},
    "promote to canary": {Role.SIGNING},
    "promote to production": {Role.ACTIVATION},
    "roll back production": {Role.ACTIVATION},
    "withdraw the canary": {Role.SIGNING, Role.ACTIVATION},
    "open a canary window": {Role.SIGNING, Role.ACTIVATION},
    "pin a base": {Role.ADMIN},
    "add a replica": {Role.ADMIN},  # a person's: every evaluation believes a replica's figures
    "remove a replica": {Role.ADMIN},
    "pin an adapter": {Role.ADMIN},  # a person's decision: the traffic watch pins hot ones only
    "replace the hot pins": {Role.FLEET, Role.ADMIN},
    "create a token": {Role.ADMIN},
    "list tokens": {Role.ADMIN},
    "revoke a token": {Role.ADMIN},
    "add a signing key": {Role.ADMIN},
    "collect garbage": {Role.ADMIN},
}


def acting_as(world: World, role: Role, namespace: str | None = None) -> Registry:
    _, token = world.registry.create_token(role.value, f"{role.value}-holder", namespace)
    return Registry.open(world.registry.settings.model_copy(update={"token": token}))


def test_the_permission_table_says_what_the_issue_specifies():
    for operation, (action, _) in OPERATIONS.items():
        assert {role for role in Role if action in PERMISSIONS[role]} == ALLOWED[operation], operation


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_every_operation_is_allowed_to_its_roles_and_denied_to_the_others_changing_nothing(
    world, random_bundle, operation, role
):
    import shutil

    shutil.copytree(random_bundle, world.tmp / "fresh")
    _, run = OPERATIONS[operation]
    registry = acting_as(world, role)
    try:
        if role in ALLOWED[operation]:
            run(world, registry)
            return
        before = registry_snapshot(world.registry.settings)
        with pytest.raises(PermissionDenied) as denied:
            run(world, registry)
        assert denied.value.one_line().startswith("permission denied: ")
        assert registry_snapshot(world.registry.settings) == before
    finally:
        registry.close()


def test_a_namespace_bound_token_acts_inside_its_namespace_only(world, random_bundle):
    import shutil

    shutil.copytree(random_bundle, world.tmp / "fresh")
    registry = acting_as(world, Role.TRAINING, "acme/*")
    try:
        registry.register_adapter(world.tmp / "fresh", NAME)
        before = registry_snapshot(world.registry.settings)
        with pytest.raises(PermissionDenied, match="limited to acme/"):
            registry.register_adapter(world.tmp / "fresh", "other/tiny-llama/support")
        assert registry_snapshot(world.registry.settings) == before
    finally:
        registry.close()
    admin = acting_as(world, Role.ADMIN, "acme/*")
    try:
        with pytest.raises(PermissionDenied, match="fleet-wide"):
            admin.remove_replica("http://127.0.0.1:9")
    finally:
        admin.close()


@pytest.mark.parametrize(
    "token, why",
    [
        (None, "needs a token"),
        ("not-a-token", "not a loragate token"),
        (issue_token().token, "not known"),
        ("revoked", "was revoked"),
        ("wrong secret", "not known"),
    ],
    ids=["none", "malformed", "unknown", "revoked", "wrong-secret"],
)
def test_no_usable_token_is_denied_and_the_message_never_repeats_it(world, token, why):
    if token == "revoked":
        record, token = world.registry.create_token("activation", "gone")
        world.registry.revoke_token(record.token_id)
    elif token == "wrong secret":
        _, real = world.registry.create_token("activation", "someone")
        token = real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB")
    registry = Registry.open(world.registry.settings.model_copy(update={"token": token}))
    try:
        with pytest.raises(PermissionDenied, match=why) as denied:
            rollback(registry, NAME, "production")
        if token:
            assert token not in denied.value.one_line()
            if token.startswith("lgt_"):
                assert split_token(token)[1] not in denied.value.one_line()
    finally:
        registry.close()
    assert world.registry.get_adapter(NAME).production == world.versions[1]


def test_the_audit_log_names_the_token_holder_and_never_a_secret(world):
    registry = acting_as(world, Role.ACTIVATION)
    try:
        rollback(registry, NAME, "production")
    finally:
        registry.close()
    event = world.registry.history(NAME)[-1]
    assert event.action == "rollback" and event.actor.startswith("activation-holder (activation token ")
    listed = json.dumps([t.as_dict() for t in world.registry.list_tokens()])
    assert "secret" not in listed and "lgt_" not in listed


def test_in_process_principal_is_never_used_by_the_cli_flows_or_tasks():
    """Every face a user reaches authenticates a token; only tests and benchmarks hold the
    database and act in process."""
    root = Path(__file__).resolve().parents[1]
    scanned = [
        p
        for folder in ("cli", "flows", "tasks", "local", "registry")
        for p in (root / "loragate" / folder).rglob("*.py")
    ]
    assert len(scanned) > 100  # the faces themselves, not folders that are not there
    offenders = [str(p.relative_to(root)) for p in scanned if "in_process(" in p.read_text() and p.name != "access.py"]
    assert offenders == []
    assert Principal.in_process("x").roles == ALL


# -- the CLI: exit 3, one line, nothing changed; the first admin token --------------------


def test_init_writes_the_first_admin_token_owner_only_and_never_prints_it(catalogued_cli, tmp_path):
    token_file = tmp_path / "home" / "admin.token"
    mode = stat.S_IMODE(os.stat(token_file).st_mode)
    assert mode == 0o600
    token = token_file.read_text().strip()
    again = catalogued_cli("init", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["admin_token_file"] is None  # only the first
    assert token_file.read_text().strip() == token and token not in again.stdout + again.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["promote", "{version}", "--to", "canary"],
        ["rollback", "acme/tiny-llama/support"],
        ["token", "create", "--role", "admin", "--holder", "me"],
        ["fleet", "add", "http://127.0.0.1:9", "--base", "tiny-llama", "--role", "canary", "--adapter-dir", "/tmp/x"],
        ["base", "add", "{base}", "--id", "tiny-llama-2"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_denied_command_exits_3_with_one_line_and_changes_nothing(
    catalogued_cli, tmp_path, tiny_base, seeded_bundles, argv
):
    from loragate.registry.settings import Settings

    settings = Settings(home=tmp_path / "home")
    registered = catalogued_cli("register", str(seeded_bundles[0]), "--name", NAME)
    version = registered.stdout.strip()
    with Registry.open(settings, principal=IN_PROCESS) as registry:
        _, trainer = registry.create_token("training", "trainer")
    before = registry_snapshot(settings)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "loragate"), *[a.format(version=version, base=tiny_base) for a in argv]],
        capture_output=True,
        text=True,
        env={**os.environ, "LORAGATE_HOME": str(tmp_path / "home"), "LORAGATE_TOKEN": trainer},
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: permission denied: "), lines
    assert trainer not in result.stderr + result.stdout
    assert registry_snapshot(settings) == before


def test_signing_only_moves_a_validated_version_to_canary(world, random_bundle):
    from loragate.registry.errors import IllegalTransition

    fresh = world.registry.register_adapter(random_bundle, NAME).version.version_id
    registry = acting_as(world, Role.SIGNING)
    try:
        with pytest.raises(IllegalTransition):
            promote(registry, fresh, "canary")  # registered, never validated
        promote(registry, world.versions[3], "canary")
    finally:
        registry.close()
    assert world.registry.get_adapter(NAME).canary == world.versions[3]


def test_a_signature_is_recorded_once_per_key_and_run(world):
    first = sign(world.registry, world.versions[3])
    again = sign(world.registry, world.versions[3])
    assert first.id == again.id and len(world.registry.signatures(world.versions[3])) == 1


# -- the flows: each gate acts with the token its pool's worker holds --------------------


@pytest.mark.slow
@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
def test_the_register_gate_acts_only_with_a_training_token_from_its_workers_secrets(
    world, random_bundle, prefect_harness, role, monkeypatch, worker_secrets
):
    """Whatever token the worker's training file holds is what the gate acts as: a token of
    another role is refused and nothing is written."""
    from prefect import flow

    from loragate.tasks.gates import register_bundle

    _, token = world.registry.create_token(role.value, f"pipeline-{role.value}")
    worker_secrets({Role.TRAINING: token})
    monkeypatch.setenv("LORAGATE_DATABASE_URL", world.registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", world.registry.settings.artifacts)

    @flow
    def register_once() -> dict:
        return register_bundle.fn(str(random_bundle), NAME)

    before = registry_snapshot(world.registry.settings)
    state = register_once(return_state=True)
    if role == Role.TRAINING:
        assert state.is_completed(), state
        assert state.result()["created"] is True
    else:
        assert state.is_failed() and "PermissionDenied" in (state.message or ""), state
        assert "takes training" in (state.message or "")
        assert registry_snapshot(world.registry.settings) == before


@pytest.mark.parametrize("held", [Role.SIGNING, Role.ACTIVATION, Role.FLEET], ids=lambda r: r.value)
def test_a_worker_of_another_pool_cannot_act_as_training_even_with_a_token_in_its_environment(
    world, random_bundle, held, monkeypatch, worker_secrets
):
    """A worker's secrets directory is all it acts with: asking it for a role it holds no
    token of is missing_credential, whatever ``LORAGATE_TOKEN`` says, and nothing is written."""
    from loragate.tasks.credentials import SECRETS_DIR_VARIABLE, registry_as

    worker_secrets({held: world.registry.create_token(held.value, f"pipeline-{held.value}")[1]})
    monkeypatch.setenv("LORAGATE_TOKEN", world.registry.create_token("training", "someone")[1])
    monkeypatch.setenv("LORAGATE_DATABASE_URL", world.registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", world.registry.settings.artifacts)
    before = registry_snapshot(world.registry.settings)
    with pytest.raises(PermissionDenied) as refused:
        registry_as(Role.TRAINING)
    assert (refused.value.code, refused.value.field) == (ErrorCode.MISSING_CREDENTIAL, SECRETS_DIR_VARIABLE)
    assert "no training token" in refused.value.message
    with registry_as(held) as registry:  # what it does hold, it acts as
        assert registry.principal.roles == {held}
    assert registry_snapshot(world.registry.settings) == before


def _public_key() -> bytes:
    return generate_key_pair().public_pem


@pytest.mark.parametrize(
    ("call", "code", "field"),
    [
        (lambda r: r.create_token("root", "alice"), ErrorCode.INVALID_ROLE, "role"),
        (lambda r: r.create_token("admin", "alice", namespace="*"), ErrorCode.INVALID_NAMESPACE, "namespace"),
        (lambda r: r.create_token("admin", "   "), ErrorCode.INVALID_HOLDER, "holder"),
        (lambda r: r.create_token("admin", "x" * 65), ErrorCode.INVALID_HOLDER, "holder"),
        (
            lambda r: r.add_signing_key(generate_key_pair().public_pem, "wizard", "alice"),
            ErrorCode.INVALID_ROLE,
            "role",
        ),
        (
            lambda r: r.add_signing_key(generate_key_pair().public_pem, "fleet", "alice"),  # the fleet signs nothing
            ErrorCode.INVALID_ROLE,
            "role",
        ),
        (
            lambda r: r.add_signing_key(generate_key_pair().public_pem, "signing", ""),
            ErrorCode.INVALID_HOLDER,
            "holder",
        ),
    ],
    ids=["role", "namespace", "blank-holder", "long-holder", "key-role", "key-role-fleet", "key-holder"],
)
def test_bad_access_input_names_its_own_code_and_field_and_changes_nothing(world, call, code, field):
    registry = world.registry
    tokens, keys = len(registry.list_tokens()), len(registry.list_signing_keys())
    with pytest.raises(InvalidInput) as refused:
        call(registry)
    assert (refused.value.code, refused.value.field) == (code, field)
    assert (len(registry.list_tokens()), len(registry.list_signing_keys())) == (tokens, keys)
