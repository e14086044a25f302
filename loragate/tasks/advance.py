"""The level-triggered half of the pipeline: the ``advance`` sweep.

Events drive the gates for latency, but an event can be lost and a trigger's action can
fail (a 503 from a busy Prefect server), and then nothing would ever act on the version
again. The sweep reads the registry instead (``Registry.waiting``): every version that has
waited for a gate longer than ``LORAGATE_ADVANCE_AFTER_S`` gets a run of that gate's
deployment with the parameters its event would have given -- unless a live run (scheduled,
pending, running, paused) of that deployment already has them. The gates are idempotent,
so a run that turns out to be redundant changes nothing. One validation run per base,
like the trigger. A version waiting longer than ``LORAGATE_STUCK_ALERT_S`` is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType

from loragate.registry.records.adapters import utcnow
from loragate.registry.records.progress import Gate, Waiting
from loragate.registry.service import Registry
from loragate.tasks.credentials import registry_reader

# the deployment each gate runs as (prefect.yaml)
DEPLOYMENTS = {
    Gate.VALIDATE: "shadow-validate/shadow-validate",
    Gate.CANARY: "canary/canary",
    Gate.SIGN_OFF: "promote/promote",
}
LIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED]


def parameters_for(waiting: Waiting) -> dict[str, str]:
    """What the gate's trigger would have passed."""
    return {"base": waiting.base} if waiting.gate == Gate.VALIDATE else {"version_id": waiting.version_id}


@dataclass
class Nudge:
    """What the sweep did for one waiting version."""

    waiting: Waiting
    deployment: str
    parameters: dict[str, str]
    action: str = ""  # started, running, (nothing: another version's run covers it)
    flow_run_id: str | None = None
    alert: bool = False

    def row(self, now: datetime) -> dict[str, Any]:
        return {
            **self.waiting.as_dict(now),
            "deployment": self.deployment,
            "action": self.action,
            "flow_run_id": self.flow_run_id,
        }


def plan_nudges(waiting: list[Waiting], live: dict[str, list[tuple[dict[str, Any], str]]]) -> list[Nudge]:
    """One nudge per waiting version: ``running`` when a live run of its deployment has its
    parameters (or, for a sign-off, is the run that claimed it), ``covered`` when an earlier
    nudge starts the run it needs (one validation per base), else ``start``."""
    nudges: list[Nudge] = []
    starting: set[tuple[str, str]] = set()
    for w in waiting:
        deployment, params = DEPLOYMENTS[w.gate], parameters_for(w)
        nudge = Nudge(w, deployment, params)
        runs = live.get(deployment, [])
        running = next((run_id for p, run_id in runs if p == params), None)
        if running is None and w.approval_flow_run_id is not None:
            running = next((run_id for _, run_id in runs if run_id == w.approval_flow_run_id), None)
        key = (deployment, repr(sorted(params.items())))
        if running is not None:
            nudge.action, nudge.flow_run_id = "running", running
        elif key in starting:
            nudge.action = "covered"
        else:
            nudge.action = "start"
            starting.add(key)
        nudges.append(nudge)
    return nudges


def deployment_ids(client: SyncPrefectClient, deployments: list[str]) -> dict[str, UUID]:
    """The id of each deployment that exists on this server, by name."""
    ids = {}
    for name in deployments:
        try:
            ids[name] = client.read_deployment_by_name(name).id
        except Exception:  # noqa: BLE001 -- not deployed on this server: nothing runs there
            continue
    return ids


def live_runs(client: SyncPrefectClient, ids: dict[str, UUID]) -> dict[str, list[tuple[dict[str, Any], str]]]:
    """The live runs of each deployment: (parameters, flow run id)."""
    if not ids:
        return {}
    names = {deployment_id: name for name, deployment_id in ids.items()}
    runs = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=list(names))),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=LIVE))),
        limit=200,
    )
    found: dict[str, list[tuple[dict[str, Any], str]]] = {name: [] for name in ids}
    for run in runs:
        if run.deployment_id in names:
            found[names[run.deployment_id]].append((dict(run.parameters), str(run.id)))
    return found


def versions_with_live_runs(gate: Gate) -> set[str]:
    """The versions a live run of ``gate``'s deployment was started for: announcing one of
    them again would only queue a second run that finds nothing to do."""
    deployment = DEPLOYMENTS[gate]
    with get_client(sync_client=True) as client:
        runs = live_runs(client, deployment_ids(client, [deployment])).get(deployment, [])
    return {str(parameters["version_id"]) for parameters, _ in runs if "version_id" in parameters}


def advance(registry: Registry, *, after_s: float, alert_s: float) -> list[Nudge]:
    """Start a run for every version that has waited longer than ``after_s`` with none live;
    marks those waiting longer than ``alert_s``."""
    waiting = registry.waiting(longer_than_s=after_s)
    if not waiting:
        return []
    now = utcnow()
    with get_client(sync_client=True) as client:
        ids = deployment_ids(client, sorted(set(DEPLOYMENTS.values())))
        nudges = plan_nudges(waiting, live_runs(client, ids))
        for nudge in nudges:
            nudge.alert = nudge.waiting.waited_s(now) >= alert_s
            if nudge.action != "start":
                continue
            # a gate not deployed here fails the sweep as reading it would (ObjectNotFound)
            deployment_id = ids.get(nudge.deployment) or client.read_deployment_by_name(nudge.deployment).id
            run = client.create_flow_run_from_deployment(deployment_id, parameters=nudge.parameters, tags=["advance"])
            nudge.action, nudge.flow_run_id = "started", str(run.id)
    return nudges


@task(cache_policy=NO_CACHE, name="advance-waiting-versions")
def advance_waiting_versions(after_s: float, alert_s: float) -> list[dict[str, Any]]:
    with registry_reader() as registry:
        nudges = advance(registry, after_s=after_s, alert_s=alert_s)
    now = utcnow()
    return [{**n.row(now), "alert": n.alert} for n in nudges]
