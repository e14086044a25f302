"""The warm worker (``loragate/local/warm_worker.py``) runs a pool's deployment runs in threads of its
own process: what a process worker does for a flow run -- claim it, run the deployment's
entrypoint, record its final state, re-run a resumed suspension from the top -- without a
process start. Against a real ``prefect server start`` and a real worker process."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from loragate.local.warm_worker import WarmWorker, module_of_entrypoint
from tests.support.prefect_env import (  # noqa: F401  (a fixture)
    client_env,
    prefect_server_fixture,
    start_worker,
    stop_process,
    wait_for_state,
)
from tests.support.warm_probes import ROOT, deploy_probes, start_run

PRELOADED = "tests.support.warm_preloaded"  # imported by the worker at its start, by nothing else


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        ("loragate/flows/rollback.py:rollback_flow", ("loragate.flows.rollback", "rollback_flow")),
        ("loragate/flows/canary.py:canary_evaluate_flow", ("loragate.flows.canary", "canary_evaluate_flow")),
        # a module of the repository that is not a gate: whoever edits a deployment does not
        # get to pick the code a worker runs with its pool's token
        ("tests/support/warm_flows.py:warm_probe", None),
        ("kit/demo.py:main", None),
        ("loragate/flowsy/x.py:f", None),
        ("flows/rollback.py:rollback_flow", None),  # the layout before the one package
        ("/abs/loragate/flows/rollback.py:rollback_flow", None),
        ("loragate/flows/../../kit/demo.py:main", None),
        ("loragate/flows/rollback.py", None),
        ("loragate/flows/rollback:rollback_flow", None),
        ("loragate/flows/rollback.py:os.system", None),
    ],
)
def test_an_entrypoint_is_a_flow_module_of_the_package_or_refused(entrypoint, expected):
    if expected is None:
        with pytest.raises(ValueError, match="entrypoint"):
            module_of_entrypoint(entrypoint)
    else:
        assert module_of_entrypoint(entrypoint) == expected


def test_an_attribute_that_is_not_a_flow_is_refused():
    worker = WarmWorker(work_pool_name="unused")
    with pytest.raises(ValueError, match="names no flow"):
        worker.flow_for_entrypoint("loragate/flows/rollback.py:artifact_key")
    assert worker.flow_for_entrypoint("loragate/flows/rollback.py:rollback_flow").name == "rollback"


def test_a_run_takes_its_entrypoint_from_the_deployment_its_configuration_was_built_from():
    """Prefect's worker read the run's deployment to build its configuration; the warm
    worker runs that deployment's entrypoint without asking the API again -- and asks only
    when the configuration was built from another deployment (here: a worker never started,
    whose every API call raises)."""
    import asyncio

    from prefect.client.schemas.objects import FlowRun
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.workers.process import ProcessJobConfiguration

    worker = WarmWorker(work_pool_name="unused")
    deployment = DeploymentResponse(
        id=uuid.uuid4(), name="rollback", flow_id=uuid.uuid4(), entrypoint="loragate/flows/rollback.py:rollback_flow"
    )
    run = FlowRun(id=uuid.uuid4(), flow_id=deployment.flow_id, deployment_id=deployment.id)
    configuration = ProcessJobConfiguration()
    configuration.prepare_for_flow_run(flow_run=run, deployment=deployment)
    assert asyncio.run(worker._flow_of(run, configuration)).name == "rollback"

    another = FlowRun(id=uuid.uuid4(), flow_id=deployment.flow_id, deployment_id=uuid.uuid4())
    with pytest.raises(RuntimeError, match="not been correctly initialized"):
        asyncio.run(worker._flow_of(another, configuration))


@pytest.fixture(scope="module")
def warm_pool(prefect_server):
    """The probe deployments and one warm worker (3 runs at once)."""
    pool, deployments = deploy_probes(prefect_server)
    worker = start_worker(
        prefect_server, pool, cwd=ROOT, limit=3, warm=True, flows_package="tests.support", preload=(PRELOADED,)
    )
    try:
        yield deployments, worker
    finally:
        stop_process(worker)


def _records(out: Path) -> list[tuple[str, int, int]]:
    return [(m, int(p), int(t)) for m, p, t in (line.split() for line in out.read_text().splitlines())]


def test_deployment_runs_complete_in_the_warm_workers_own_process(prefect_server, warm_pool, tmp_path):
    deployments, worker = warm_pool
    out = tmp_path / "runs"
    for marker in ("first", "second"):
        run_id = start_run(prefect_server, deployments["warm-probe"], out=str(out), marker=marker)
        wait_for_state(prefect_server, run_id, "COMPLETED", timeout_s=60)
    assert [(m, p) for m, p, _ in _records(out)] == [("first", worker.pid), ("second", worker.pid)]


def test_a_run_finds_the_modules_its_pool_preloads_already_imported(prefect_server, warm_pool, tmp_path):
    deployments, worker = warm_pool
    out = tmp_path / "runs"
    for imported, marker in ((PRELOADED, "preloaded-imported"), ("tests.support.never_imported", "other-not-imported")):
        run_id = start_run(
            prefect_server, deployments["warm-probe"], out=str(out), marker=marker.split("-")[0], imported=imported
        )
        wait_for_state(prefect_server, run_id, "COMPLETED", timeout_s=60)
        assert _records(out)[-1][:2] == (marker, worker.pid)


def test_a_worker_whose_preload_does_not_import_stops_at_its_start(prefect_server):
    worker = start_worker(prefect_server, "unused", cwd=ROOT, warm=True, preload=("tests.support.no_such_module",))
    try:
        assert worker.wait(timeout=120) != 0
    finally:
        stop_process(worker)


def test_runs_started_together_run_at_once_in_threads_of_one_process(prefect_server, warm_pool, tmp_path):
    deployments, worker = warm_pool
    out = tmp_path / "runs"
    runs = [
        start_run(prefect_server, deployments["warm-probe"], out=str(out), marker=f"r{i}", wait_for_lines=3)
        for i in range(3)
    ]
    for run_id in runs:
        wait_for_state(prefect_server, run_id, "COMPLETED", timeout_s=90)
    records = _records(out)
    assert {p for _, p, _ in records} == {worker.pid}
    assert len({t for _, _, t in records}) == 3


def test_a_failing_gate_is_recorded_failed_and_the_worker_runs_the_next(prefect_server, warm_pool, tmp_path):
    deployments, worker = warm_pool
    out = tmp_path / "runs"
    failed = wait_for_state(
        prefect_server, start_run(prefect_server, deployments["warm-failing"], out=str(out)), "FAILED", timeout_s=60
    )
    assert "this gate failed on purpose" in (failed.state.message or "")
    after = start_run(prefect_server, deployments["warm-probe"], out=str(out), marker="after")
    wait_for_state(prefect_server, after, "COMPLETED", timeout_s=60)
    assert [m for m, _, _ in _records(out)] == ["failing", "after"]
    assert worker.poll() is None


def test_suspended_runs_hold_no_slot_and_resumed_reenter_from_the_top_in_the_same_process(
    prefect_server, warm_pool, tmp_path
):
    """As many runs suspended as the worker has slots (3), and another run still starts:
    a sign-off that waits holds no thread."""
    from prefect.client.orchestration import get_client

    deployments, worker = warm_pool
    out = tmp_path / "runs"
    waiting = [start_run(prefect_server, deployments["warm-suspending"], out=str(out)) for _ in range(3)]
    for run_id in waiting:
        assert wait_for_state(prefect_server, run_id, "PAUSED", timeout_s=60).state.name == "Suspended"
    probe = start_run(prefect_server, deployments["warm-probe"], out=str(out), marker="meanwhile")
    wait_for_state(prefect_server, probe, "COMPLETED", timeout_s=60)
    with client_env(prefect_server), get_client(sync_client=True) as client:
        for run_id in waiting:
            client.resume_flow_run(run_id)
    for run_id in waiting:
        wait_for_state(prefect_server, run_id, "COMPLETED", timeout_s=60)
    records = _records(out)
    assert sorted(m for m, _, _ in records) == ["entered"] * 6 + ["meanwhile"] + ["resumed"] * 3
    assert {p for _, p, _ in records} == {worker.pid}


def test_a_deployment_pointing_outside_the_flows_package_crashes_unrun_and_the_worker_goes_on(
    prefect_server, warm_pool, tmp_path
):
    deployments, worker = warm_pool
    crashed = wait_for_state(prefect_server, start_run(prefect_server, deployments["warm-outside"]), "CRASHED", 60)
    assert "outside 'tests.support'" in (crashed.state.message or "")
    from prefect.client.orchestration import get_client

    with client_env(prefect_server), get_client(sync_client=True) as client:
        states = [state.type.value for state in client.read_flow_run_states(crashed.id)]
    assert "RUNNING" not in states, states  # no flow was entered
    out = tmp_path / "runs"
    wait_for_state(
        prefect_server,
        start_run(prefect_server, deployments["warm-probe"], out=str(out), marker="next"),
        "COMPLETED",
        60,
    )
    assert worker.poll() is None
