"""What bench/scale.py asks the Prefect server: every flow run's end state and times, the
``promote`` runs waiting for a sign-off, and pausing a deployment's trigger.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from loragate.local.pipeline import LocalPipeline

PAGE = 200  # the most flow runs the API returns at once


def flow_run_states(pipeline: LocalPipeline) -> dict[str, dict[str, Any]]:
    """Every flow run the server holds, by flow: how many ended in each state, and how long
    they queued (from when they were due to when they ran: trigger, worker poll, process
    start) and ran (scheduled runs not yet due left out)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import temporary_settings

    counts: dict[str, Counter[str]] = {}
    queued: dict[str, list[float]] = {}
    ran: dict[str, list[float]] = {}
    with temporary_settings(pipeline.server.client_settings()), get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        offset = 0
        while True:
            page = client.read_flow_runs(limit=PAGE, offset=offset)
            for run in page:
                state = run.state.name if run.state else "?"
                if state == "Scheduled":
                    continue
                flow = flows.get(run.flow_id, "?")
                counts.setdefault(flow, Counter())[state] += 1
                due = run.expected_start_time or run.created
                if run.start_time and due:
                    queued.setdefault(flow, []).append((run.start_time - due).total_seconds())
                if run.start_time and run.end_time:
                    ran.setdefault(flow, []).append((run.end_time - run.start_time).total_seconds())
            if len(page) < PAGE:
                break
            offset += PAGE
    return {
        flow: {
            "states": dict(c),
            "queued_s": median_max(queued.get(flow, [])),
            "ran_s": median_max(ran.get(flow, [])),
        }
        for flow, c in sorted(counts.items())
    }


def median_max(samples: list[float]) -> dict[str, float] | None:
    if not samples:
        return None
    return {"median": round(statistics.median(samples), 1), "max": round(max(samples), 1)}


def promote_runs(pipeline: LocalPipeline) -> list[tuple[str, str]]:
    """(flow run id, state name) of every ``promote`` run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import temporary_settings

    runs = []
    with temporary_settings(pipeline.server.client_settings()), get_client(sync_client=True) as client:
        while True:
            page = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["promote"])), limit=PAGE, offset=len(runs)
            )
            runs += page
            if len(page) < PAGE:
                break
    return [(str(r.id), r.state.name if r.state else "?") for r in runs]


def pause_trigger(pipeline: LocalPipeline, deployment: str) -> int:
    """Pause the automations that run ``deployment`` (its triggers): events arrive, and
    nothing acts on them -- as when a trigger's action fails."""
    from prefect.client.orchestration import get_client
    from prefect.settings import temporary_settings

    paused = 0
    with temporary_settings(pipeline.server.client_settings()), get_client(sync_client=True) as client:
        target = client.read_deployment_by_name(f"{deployment}/{deployment}").id
        for automation in client.read_automations():
            if any(getattr(a, "deployment_id", None) == target for a in automation.actions):
                client.pause_automation(automation.id)
                paused += 1
    if not paused:
        raise SystemExit(f"bench/scale: no automation runs the {deployment} deployment")
    return paused
