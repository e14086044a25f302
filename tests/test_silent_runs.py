"""A flow run whose process is gone is crashed by the ``advance`` sweep
(``tasks/unresponsive.py``): RUNNING, and no event of it -- heartbeat, state change -- on
the server for the silence limit. Judged from the run's state, never from an event's
arrival: a suspended sign-off is left waiting whatever arrives late, and a run that beats
is left working however long it works. Against a real ``prefect server start`` and real
warm workers, one of them SIGKILLed."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from loragate.local.prefect_local import HEARTBEAT_ENV, HEARTBEAT_S
from loragate.registry.records.adapters import utcnow
from loragate.tasks import unresponsive
from loragate.tasks.unresponsive import crash_silent_runs, silence_limit_s
from tests.support.prefect_env import (  # noqa: F401  (a fixture)
    client_env,
    prefect_server_fixture,
    start_worker,
    stop_process,
    wait_for_state,
)
from tests.support.warm_probes import ROOT, deploy_probes, start_run

SILENCE_S = 40.0  # more than one heartbeat interval: a run that beats always has an event in it


@pytest.mark.parametrize(
    ("after_s", "heartbeat_s", "expected"),
    [
        (180.0, 30, 180.0),  # the pipeline's workers: the setting
        (180.0, 180, 540.0),  # Prefect's default interval (make demo): three beats missed at least
        (600.0, 30, 600.0),
        (10.0, 30, 90.0),  # a setting shorter than three beats is not taken
        (180.0, None, None),  # runs that do not beat are never judged by silence
    ],
)
def test_the_silence_limit_is_the_setting_never_under_three_heartbeats_and_none_without_them(
    after_s, heartbeat_s, expected
):
    assert silence_limit_s(after_s, heartbeat_s) == expected


def _worker(server, pool):
    return start_worker(server, pool, HEARTBEAT_ENV, cwd=ROOT, warm=True, flows_package="tests.support")


def test_a_killed_workers_run_is_crashed_once_silent_and_suspended_or_beating_runs_are_left(prefect_server, tmp_path):
    """The run is killed before its first heartbeat (the automation of an earlier stop left
    such a run RUNNING for good); a sign-off suspended on the same worker stays PAUSED; a run
    on a live worker that works longer than the silence limit, with nothing but its
    heartbeats to show for it, is never proposed Crashed and completes."""
    tag = f"silent-{uuid.uuid4().hex[:8]}"  # this test's runs only: the server is the session's
    doomed_pool, doomed = deploy_probes(prefect_server, tags=[tag])
    live_pool, live = deploy_probes(prefect_server, tags=[tag])
    out = tmp_path / "runs"
    doomed_worker, live_worker = _worker(prefect_server, doomed_pool), _worker(prefect_server, live_pool)
    try:
        waiting = start_run(prefect_server, doomed["warm-suspending"], out=str(out))
        wait_for_state(prefect_server, waiting, "PAUSED", timeout_s=120)
        busy = start_run(prefect_server, live["warm-busy"], out=str(out), seconds=SILENCE_S + 2 * HEARTBEAT_S)
        wait_for_state(prefect_server, busy, "RUNNING", timeout_s=120)
        cut = start_run(
            prefect_server, doomed["warm-probe"], out=str(out), marker="cut", wait_for_lines=99, deadline_s=600
        )
        started = wait_for_state(prefect_server, cut, "RUNNING", timeout_s=60).start_time
        os.killpg(doomed_worker.pid, signal.SIGKILL)  # as an evicted pod or an OOM kill: no goodbye
        doomed_worker.wait(timeout=30)

        from prefect.client.orchestration import get_client

        crashed: list[str] = []
        end = time.monotonic() + SILENCE_S + 90
        with client_env(prefect_server), get_client(sync_client=True) as client:
            while str(cut) not in crashed:
                assert time.monotonic() < end, f"run {cut} not crashed {SILENCE_S + 90:.0f} s after its worker died"
                found = crash_silent_runs(client, SILENCE_S, utcnow(), tag)
                assert all(run.crashed for run in found)
                crashed += [run.flow_run_id for run in found]
                time.sleep(2.0)
        assert crashed == [str(cut)]  # proposed once, and nothing else ever
        run = wait_for_state(prefect_server, cut, "CRASHED", timeout_s=5)
        assert "no event for 40 s" in (run.state.message or "")
        assert (run.state.timestamp - started).total_seconds() >= SILENCE_S  # not before its window

        assert wait_for_state(prefect_server, waiting, "PAUSED", timeout_s=1).state.name == "Suspended"
        with client_env(prefect_server), get_client(sync_client=True) as client:
            while client.read_flow_run(busy).state.type.value == "RUNNING":
                assert not crash_silent_runs(client, SILENCE_S, utcnow(), tag), "a run that beats was judged silent"
                time.sleep(2.0)
        assert wait_for_state(prefect_server, busy, "COMPLETED", timeout_s=5)
    finally:
        stop_process(doomed_worker)
        stop_process(live_worker)


def test_a_run_that_ended_after_it_was_read_keeps_its_final_state(prefect_server, tmp_path, monkeypatch):
    """The sweep reads RUNNING runs, then proposes Crashed: a run that completes in between
    is not overwritten -- the proposal is not forced, and Prefect refuses to leave a final
    state. (The read is pinned to the moment the run was still running.)"""
    from prefect.client.orchestration import get_client

    pool, deployments = deploy_probes(prefect_server, tags=[f"silent-{uuid.uuid4().hex[:8]}"])
    worker = _worker(prefect_server, pool)
    try:
        done = start_run(prefect_server, deployments["warm-probe"], out=str(tmp_path / "runs"), marker="done")
        wait_for_state(prefect_server, done, "COMPLETED", timeout_s=120)
    finally:
        stop_process(worker)
    with client_env(prefect_server), get_client(sync_client=True) as client:
        read_while_running = client.read_flow_run(done)
        monkeypatch.setattr(unresponsive, "running_pipeline_runs", lambda *_: [read_while_running])
        monkeypatch.setattr(unresponsive, "has_event_since", lambda *_: False)
        # a limit that puts its start before the window
        found = crash_silent_runs(client, 0.001, utcnow())
        assert [(run.flow_run_id, run.crashed) for run in found] == [(str(done), False)]
        assert client.read_flow_run(done).state.type.value == "COMPLETED"
