"""Scheduled fleet reconcile: every replica made to serve what the pointers say (a restarted
replica gets its adapters back, a wrong path is corrected, a stray name unloaded)."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact

from loragate.tasks.gates import reconcile_fleet


@flow(name="reconcile", log_prints=True)
def reconcile_flow() -> list[dict[str, Any]]:
    states = reconcile_fleet()
    create_table_artifact(
        key="fleet-reconcile",
        table=[
            {
                "replica": s["url"],
                "role": s["role"],
                "reachable": s["reachable"],
                "done": "; ".join(s["done"]) or "-",
                "error": s["error"] or "-",
            }
            for s in states
        ],
        description="What the last reconcile did on each replica",
    )
    return states
