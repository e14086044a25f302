"""The promotion's Prefect transaction on real replicas: when a step after the production
move fails, the rollback hook of the move puts the previous production back, in place, on
every replica -- the pointer move is not left standing on its own."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prefect import flow, task
from prefect.transactions import transaction

from loragate.registry.rules.access import Role
from loragate.registry.rules.canary import Monitor, Observation, SideStats, Verdict, WindowStatus
from loragate.registry.service import Registry
from loragate.tasks.gates import promote_production
from tests.support.fleet import make_fleet, serves_version

pytestmark = pytest.mark.slow


class VerificationFailed(Exception):
    pass


@task
def failing_verification() -> None:
    raise VerificationFailed("a replica does not serve what the registry says")


@flow
def promote_then_fail(version_id: str) -> None:
    with transaction():
        promote_production(version_id, "approved by test")
        failing_verification()


def test_a_failure_after_the_production_move_rolls_it_back_in_place(
    tmp_path, replicas, replica_adapters, validated_adapters, prefect_harness, monkeypatch, worker_secrets
):
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters)
    registry = fleet.registry
    try:
        fleet.promote(fleet.v1, "canary")
        fleet.promote(fleet.v1, "production")
        fleet.promote(fleet.v2, "canary")
        window, _ = registry.open_canary_window(fleet.v2)
        stats = SideStats(8, 0, 10.0, 20.0)
        registry.record_canary_observation(
            Observation(
                window.id,
                datetime.now(UTC),
                stats,
                stats,
                0.0,
                [],
                Verdict.READY,
                [Monitor("p95_ms", 20, 22, True)],
                [],
            )
        )
        # the gates read their settings from the worker's environment
        monkeypatch.setenv("LORAGATE_DATABASE_URL", registry.settings.database_url)
        monkeypatch.setenv("LORAGATE_ARTIFACTS", registry.settings.artifacts)
        monkeypatch.setenv("LORAGATE_ACTOR", "pipeline-test")
        # and act with the activation role's token from the release pool's secrets directory,
        # on alice's sign-off (a pipeline token moves production only on a person's)
        pipeline = registry.create_token("activation", "pipeline", pipeline=True)[1]
        # the release pool switches replicas: it holds their admin key
        admin_key = (replicas["prod-a"].secrets_dir / "admin-key").read_text()
        worker_secrets({Role.ACTIVATION: pipeline}, replica_admin_key=admin_key)
        alice = registry.settings.model_copy(update={"token": registry.create_token("activation", "alice")[1]})
        with Registry.open(alice) as as_alice:
            code = as_alice.issue_approval_code(fleet.v2)[1]
        with Registry.open(registry.settings.model_copy(update={"token": pipeline})) as as_pipeline:
            as_pipeline.record_approval(window.id, approve=True, reviewer="alice", code=code)

        with pytest.raises(VerificationFailed):
            promote_then_fail(fleet.v2)

        adapter = registry.get_adapter(fleet.name)
        assert adapter.production == fleet.v1, "the transaction's rollback restored the previous production"
        for key in ("prod-a", "prod-b"):
            # the previous version was kept warm: the undo only moved users back to it
            assert serves_version(replicas[key], fleet.name, fleet.v1, fleet.path(fleet.v1))
        undo = [e for e in registry.history(fleet.name) if e.action == "rollback"]
        assert undo and "promotion rolled back" in (undo[-1].reason or "")
        assert registry.canary_window(window.id).status == WindowStatus.ROLLED_BACK
    finally:
        registry.close()
