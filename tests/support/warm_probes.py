"""Deploying the probe flows of ``tests/support/warm_flows.py`` on a work pool of their own,
and starting their runs: what the warm-worker and silent-run tests share."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests.support.prefect_env import PrefectServer, client_env

ROOT = Path(__file__).resolve().parents[2]
FLOWS = "tests/support/warm_flows.py"


def deploy_probes(server: PrefectServer, tags: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """A process pool of its own with a deployment per probe flow: (pool, deployment ids)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"warm-{uuid.uuid4().hex[:8]}"
    with client_env(server), get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        deployments = {}
        for flow_name, entrypoint in (
            ("warm-probe", f"{FLOWS}:warm_probe"),
            ("warm-failing", f"{FLOWS}:warm_failing"),
            ("warm-suspending", f"{FLOWS}:warm_suspending"),
            ("warm-busy", f"{FLOWS}:warm_busy"),
            # a deployment edited to run something that is not a flow of the worker's package
            ("warm-outside", "loragate/flows/rollback.py:rollback_flow"),
        ):
            flow_id = client.create_flow_from_name(flow_name)
            deployments[flow_name] = client.create_deployment(
                flow_id=flow_id,
                name=pool,
                entrypoint=entrypoint,
                work_pool_name=pool,
                path=str(ROOT),
                tags=tags or [],
            )
    return pool, deployments


def start_run(server: PrefectServer, deployment_id, **parameters):
    """A run of the deployment, created now: its id."""
    from prefect.client.orchestration import get_client

    with client_env(server), get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(deployment_id, parameters=parameters).id
