"""Flow runs whose process is gone: RUNNING in Prefect, and silent for too long.

A warm worker runs several flow runs as threads of one process: an evicted pod, a lost node
or an OOM kill ends them all, and each stays RUNNING with nobody left to report it. The
``advance`` sweep would then see a live run for its version forever and start none, and a
dead run of a deployment with a concurrency limit (shadow validation's is 1) would hold its
slot. Every flow run sends a heartbeat event every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``
seconds (30 on the pipeline's workers, Prefect's default 180 elsewhere), so the sweep asks
the server, for each RUNNING run of loragate's deployments, for any event of it -- a
heartbeat, a state change -- within ``LORAGATE_UNRESPONSIVE_AFTER_S`` (and never less than
three heartbeat intervals). A run with none is proposed Crashed; the same sweep then finds
its version with no live run and starts its gate again (the gates are idempotent).

Decided from the run's state, not from an event's arrival: only RUNNING runs are looked at,
so a suspended sign-off (PAUSED) is never touched, however long it waits and whatever
heartbeat arrives after its Suspended event. The proposal is not forced: a run that
finished in the meantime keeps its final state (Prefect refuses to leave one). Runs that
do not beat (heartbeats off) are never judged by silence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterTags,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.events.filters import EventFilter, EventOccurredFilter, EventResourceFilter
from prefect.settings import get_current_settings
from prefect.states import Crashed

from loragate.registry.records.adapters import utcnow

PIPELINE_TAG = "loragate"  # every deployment of prefect.yaml carries it
HEARTBEATS_PER_WINDOW = 3  # a run is judged only after missing this many beats at least
PAGE = 200  # the most flow runs the API returns at once
CLOCK_SKEW = timedelta(minutes=5)


def silence_limit_s(after_s: float, heartbeat_s: float | None) -> float | None:
    """How long a RUNNING run may send no event before it counts as gone: ``after_s``, never
    less than three of its heartbeat intervals; None where runs do not beat."""
    if heartbeat_s is None:
        return None
    return max(after_s, HEARTBEATS_PER_WINDOW * heartbeat_s)


@dataclass
class SilentRun:
    """A RUNNING run with no event within the limit, and what the sweep's proposal got."""

    flow_run_id: str
    flow_run: str
    deployment_id: str | None
    running_since: str | None
    silent_for_s: float
    crashed: bool


def running_pipeline_runs(client: SyncPrefectClient, tag: str) -> list[FlowRun]:
    return client.read_flow_runs(
        deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=[tag])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))),
        limit=PAGE,
    )


def has_event_since(client: SyncPrefectClient, flow_run_id: Any, since: datetime, now: datetime) -> bool:
    window = EventFilter(
        # ``occurred`` is the emitter's clock: one a little ahead of the sweep's still counts
        occurred=EventOccurredFilter(since=since, until=now + CLOCK_SKEW),
        resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
    )
    return bool(client.read_events(filter=window, limit=1).events)


def crash_silent_runs(
    client: SyncPrefectClient, silence_s: float, now: datetime, tag: str = PIPELINE_TAG
) -> list[SilentRun]:
    """Propose Crashed to every RUNNING run of the deployments tagged ``tag`` that sent no
    event in the last ``silence_s`` seconds (and started before them)."""
    since = now - timedelta(seconds=silence_s)
    found = []
    for run in running_pipeline_runs(client, tag):
        if run.start_time is not None and run.start_time > since:
            continue  # its Running event is in the window, whether or not it reached the server
        if has_event_since(client, run.id, since, now):
            continue
        message = f"no event for {silence_s:g} s: the process running it is gone (found by the advance sweep)"
        result: Any = client.set_flow_run_state(run.id, Crashed(message=message), force=False)
        found.append(
            SilentRun(
                flow_run_id=str(run.id),
                flow_run=run.name,
                deployment_id=str(run.deployment_id) if run.deployment_id else None,
                running_since=run.start_time.isoformat() if run.start_time else None,
                silent_for_s=silence_s,
                crashed=result.status == SetStateStatus.ACCEPT,
            )
        )
    return found


@task(cache_policy=NO_CACHE, name="crash-silent-runs")
def crash_silent_runs_task(after_s: float) -> list[dict[str, Any]]:
    """What the sweep crashed (nothing where heartbeats are off)."""
    silence_s = silence_limit_s(after_s, get_current_settings().flows.heartbeat_frequency)
    if silence_s is None:
        return []
    with get_client(sync_client=True) as client:
        return [asdict(run) for run in crash_silent_runs(client, silence_s, utcnow())]
