"""A flow run whose worker died with it is marked Crashed, so no version waits on it.

A warm worker runs up to ``--limit`` flow runs as threads of one process: an evicted pod, a
lost node or an OOM kill ends them all at once, and each stays RUNNING in Prefect with no
process worker left to report it. The ``advance`` sweep would then see a live run for the
version forever and start none: stuck. Prefect's answer for self-hosted servers (its docs:
"detect zombie flows") is used as documented: every flow run emits a heartbeat event every
``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds, and an automation marks Crashed a run that
sent one and then nothing at all -- no heartbeat, no state change -- for
``UNRESPONSIVE_AFTER_S``. A suspended sign-off stops beating after its Suspended state
event, which is an event of the run: waiting for days is not unresponsive. Once the run is
Crashed the sweep finds no live run and starts the gate again; the gates are idempotent.

``python -m infra.automations [--within-s S]`` creates it, or replaces it, on the server
``PREFECT_API_URL`` names (``make demo`` and the tests: ``infra/pipeline.deploy``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from datetime import timedelta
from uuid import UUID

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

NAME = "loragate: crash unresponsive flow runs"
HEARTBEAT_S = 30  # Prefect's shortest heartbeat interval
# six heartbeats missed: a process starved of CPU for a minute is slow, not dead
UNRESPONSIVE_AFTER_S = 180
# what a worker needs in its environment for its flow runs to beat
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}


def unresponsive_runs_automation(
    within_s: float = UNRESPONSIVE_AFTER_S, *, deployment_ids: Iterable[UUID] = (), name: str = NAME
) -> Automation:
    """Crash a flow run ``within_s`` after its last heartbeat when nothing else of it came
    (of the ``deployment_ids``' runs only, when given)."""
    related = [f"prefect.deployment.{d}" for d in deployment_ids]
    return Automation(
        name=name,
        description=(
            f"A flow run that sent a heartbeat and then no event for {within_s:g} s lost its process "
            "(a warm worker's pod, a node): Crashed, so the advance sweep starts its gate again."
        ),
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            # a heartbeat or any state change (Suspended, Completed, Crashed...) of the run
            expect={"prefect.flow-run.*"},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=ResourceSpecification(
                {"prefect.resource.id": related, "prefect.resource.role": "deployment"} if related else {}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {within_s:g} s: the process running it is gone",
            )
        ],
    )


def ensure(automation: Automation) -> UUID:
    """Create ``automation``, replacing any of the same name (so a re-deploy changes it)."""
    while True:
        try:
            Automation.read(name=automation.name).delete()
        except ValueError:  # none of that name is left
            break
    created = automation.create()
    return created.id


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.automations", description=__doc__.splitlines()[0])
    parser.add_argument("--within-s", type=float, default=UNRESPONSIVE_AFTER_S, help="seconds without an event")
    args = parser.parse_args(argv)
    print(f"{NAME}: {ensure(unresponsive_runs_automation(args.within_s))}")


if __name__ == "__main__":
    main()
