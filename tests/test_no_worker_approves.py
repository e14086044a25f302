"""No credential that lives on a worker can produce a production sign-off, directly or by
minting a token: no work pool holds admin (the role that mints tokens, a person's activation
token included), the fleet pool acts as ``fleet`` -- replicas and reconcile, no token, no
key, no sign-off -- and the release pool's activation token is a pipeline token, never
issued an approval code. Admin is a person's role.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from loragate.local.pipeline import POOLS
from loragate.registry.rules.access import PERMISSIONS, Action, Role
from loragate.registry.rules.canary import Observation, SideStats, Verdict
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS, mark_validated, registry_snapshot

ROOT = Path(__file__).resolve().parents[1]
NAME = "acme/tiny-llama/support"
# what a token on a worker must never be able to do
MINT_OR_SIGN_OFF = (Action.MANAGE_TOKENS, Action.MANAGE_KEYS)


@pytest.mark.parametrize("pool", POOLS, ids=lambda p: p.name)
def test_no_pools_role_can_mint_a_token_or_register_a_key(pool):
    assert pool.role != Role.ADMIN
    assert not set(MINT_OR_SIGN_OFF) & PERMISSIONS[pool.role], pool.role


def test_only_the_release_pool_holds_a_role_that_signs_off_and_its_token_is_a_pipeline_token():
    """A pipeline token is never issued an approval code (tests/test_approvals.py): the
    release pool's activation token moves production only on a person's sign-off."""
    assert [p.name for p in POOLS if Action.APPROVE in PERMISSIONS[p.role]] == ["release"]
    pipeline_stack = (ROOT / "tests" / "support" / "pipeline_stack.py").read_text()
    assert "pipeline=True)[1]\n            for role in sorted({pool.role for pool in POOLS})" in pipeline_stack


def test_the_fleet_role_drives_the_fleet_and_nothing_else():
    assert PERMISSIONS[Role.FLEET] == {Action.MANAGE_FLEET}
    assert Action.MANAGE_FLEET in PERMISSIONS[Role.ADMIN]  # a person may still add a replica


def test_prefect_yaml_puts_reconcile_and_the_sweep_on_the_fleet_pool_which_acts_as_fleet():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    pools = {d["name"]: d["work_pool"]["name"] for d in spec["deployments"]}
    assert pools["reconcile"] == pools["advance"] == "fleet"
    assert next(p for p in POOLS if p.name == "fleet").role == Role.FLEET


@pytest.fixture
def fleet_cli(catalogued_cli, tmp_path, seeded_bundles):
    """The real ``loragate`` on a registry with one version waiting for a sign-off, run with a fleet
    pipeline token (what the fleet pool's worker holds); returns (run, version, settings)."""
    version = catalogued_cli("register", str(seeded_bundles[0]), "--name", NAME).stdout.strip()
    settings = Settings(home=tmp_path / "home")
    with Registry.open(settings, principal=IN_PROCESS) as registry:
        # in canary, its window waiting for a sign-off: a code could be issued for it
        mark_validated(registry, version)
        promote(registry, version, "canary")
        window, _ = registry.open_canary_window(version)
        side = SideStats(20, 0, 50.0, 100.0)
        ready = Observation(window.id, datetime.now(UTC), side, side, 0.0, [], Verdict.READY, [], ["ready"])
        registry.record_canary_observation(ready)
        registry.request_approval(window.id, "flow-run-1")
        _, token = registry.create_token("fleet", "pipeline-fleet", pipeline=True)
    env = {**os.environ, "LORAGATE_HOME": str(tmp_path / "home"), "LORAGATE_TOKEN": token}
    env.pop("LORAGATE_DATABASE_URL", None)
    env.pop("LORAGATE_ARTIFACTS", None)

    def run(*argv: str) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).parent / "loragate"), *argv]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert token not in result.stdout + result.stderr
        return result

    return run, version, settings


@pytest.mark.parametrize(
    "argv",
    [
        ["token", "create", "--role", "activation", "--holder", "alice"],
        ["token", "create", "--role", "admin", "--holder", "mallory"],
        ["token", "create", "--role", "fleet", "--holder", "mallory", "--pipeline"],
        ["token", "list"],
        ["approve-code", "{version}"],
        ["approve-code", "{version}", "--rollback"],
        ["promote", "{version}", "--to", "production"],
        ["key", "add", "{public_key}", "--role", "signing", "--holder", "mallory"],
        # which replicas there are: a person's (a rogue replica's figures would decide verdicts)
        ["fleet", "add", "http://127.0.0.1:9", "--base", "tiny-llama", "--role", "production", "--adapter-dir", "/x"],
        ["fleet", "remove", "http://127.0.0.1:9"],
        ["replicas", "up", "--base", "tiny-llama", "--vllm-python", "{python}"],
        ["replicas", "down"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_a_fleet_token_mints_no_token_and_signs_nothing_off(fleet_cli, tmp_path, argv):
    from loragate.registry.storage.signing import generate_key_pair

    run, version, settings = fleet_cli
    public_key = tmp_path / "mallory.pub"
    public_key.write_bytes(generate_key_pair().public_pem)
    before = registry_snapshot(settings)
    result = run(*[a.format(version=version, public_key=public_key, python=sys.executable) for a in argv])
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: permission denied: "), lines
    assert registry_snapshot(settings) == before


def test_a_fleet_token_reconciles_the_replicas_a_person_added(fleet_cli, tmp_path):
    run, _, settings = fleet_cli
    with Registry.open(settings, principal=IN_PROCESS) as registry:  # a person's act (0016)
        registry.add_replica("http://127.0.0.1:9", "tiny-llama", "canary", str(tmp_path / "adapters"))
    assert [r["url"] for r in json.loads(run("fleet", "list", "--json").stdout)] == ["http://127.0.0.1:9"]
    # every adapter held under its lock, as fleet, no admin needed: nothing listens at :9, so
    # the replica is reported unreachable (exit 1), not refused
    reconciled = run("fleet", "reconcile", "--json")
    assert reconciled.returncode == 1 and "permission" not in reconciled.stderr, reconciled.stderr
    [state] = json.loads(reconciled.stdout)
    assert (state["url"], state["reachable"]) == ("http://127.0.0.1:9", False)
