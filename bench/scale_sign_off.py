"""The sign-off section of ``bench/scale.py``: the ``promote`` runs a burst's ready windows
start, all waiting for a person -- when every one is suspended, how many of their processes
were still exiting then, when all are gone, and the processes (and memory) they and the
workers hold.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.scale_prefect import promote_runs
from bench.timing import wait_for
from kit.flow_processes import processes_running, rss_mib
from loragate.local.pipeline import LocalPipeline
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.service import Registry


def _log(message: str) -> None:
    import sys

    print(f"[bench/scale sign-off] {message}", file=sys.stderr, flush=True)


def waiting_sign_offs(pipeline: LocalPipeline, registry: Registry, label: str, deadline_s: float) -> dict[str, Any]:
    """What the burst's waiting sign-offs hold, once every ``promote`` run is suspended (or
    ``deadline_s`` has passed)."""
    ready = sum(1 for w in registry.canary_windows() if w.status == WindowStatus.READY)

    def all_waiting() -> bool:
        runs = promote_runs(pipeline)
        return len(runs) >= ready and all(state == "Suspended" for _, state in runs)

    try:
        waited = wait_for(f"{ready} promote runs suspended", all_waiting, deadline_s, every_s=2.0)
    except SystemExit as e:
        _log(str(e))
        waited = None
    runs = promote_runs(pipeline)
    run_ids = {run_id for run_id, _ in runs}
    exiting = len(processes_running(run_ids))
    # a suspended run's process exits once its engine has reported the state
    try:
        gone_after = wait_for("the suspended runs' processes to exit", lambda: not processes_running(run_ids), 120)
    except SystemExit as e:
        _log(str(e))
        gone_after = None
    held = processes_running(run_ids)
    workers = [w.pid for w in pipeline.workers]
    figures = {
        "promote_runs": len(runs),
        "states": dict(Counter(state for _, state in runs)),
        "all_suspended_after_s": round(waited, 1) if waited is not None else None,
        "processes_exiting_at_last_suspend": exiting,
        "all_exited_after_s": round(gone_after, 1) if gone_after is not None else None,
        "processes_held": len(held),
        "rss_held_mib": rss_mib(held),
        "workers_rss_mib": rss_mib(workers),
    }
    _log(f"{label}: sign-offs {figures}")
    return figures
