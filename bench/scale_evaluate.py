"""The evaluate section of ``bench/scale.py``: ``canary-evaluate`` run by hand over a burst's
open windows, again while windows stay open (up to MAX_EVALUATIONS): the first run's wall
time against the default interval, per window, and the requests sent per observation.
"""

from __future__ import annotations

import statistics
from typing import Any

from loragate.local.prefect_local import PrefectServer
from loragate.registry.rules.canary import CanaryWindow, Observation, WindowStatus
from loragate.registry.service import Registry

# canary-evaluate's schedule in prefect.yaml: 50 windows must be evaluated within it
DEFAULT_EVALUATE_INTERVAL_S = 600.0
# canary-evaluate runs again while windows are still open, at most this often
MAX_EVALUATIONS = 6


def _log(message: str) -> None:
    import sys

    print(f"[bench/scale evaluate] {message}", file=sys.stderr, flush=True)


def evaluate(
    registry: Registry, server: PrefectServer, label: str
) -> tuple[dict[str, Any], list[CanaryWindow], dict[int, list[Observation]]]:
    """The evaluate figures, every window of the burst (a rolled-back one is a verdict too)
    and each window's observations."""
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    walls: list[float | None] = []
    states: list[str] = []
    for n in range(MAX_EVALUATIONS):
        still_open = len(registry.canary_windows((WindowStatus.OPEN,)))
        if not still_open:
            break
        _log(f"{label}: canary-evaluate {n + 1} over {still_open} open windows")
        with temporary_settings(server.client_settings()):
            run = run_deployment("canary-evaluate/canary-evaluate", timeout=1800)
        ran = run.end_time and run.start_time and (run.end_time - run.start_time).total_seconds()
        walls.append(round(ran, 1) if ran else None)
        states.append(run.state.name if run.state else "?")
    evaluate_s = walls[0] if walls else None
    windows = registry.canary_windows(None)  # every window: a rolled-back one is a verdict too
    observations = {w.id: registry.canary_observations(w.id) for w in windows}
    first = [obs[0] for obs in observations.values() if obs]
    requests = [o.canary.requests + o.production.requests for o in first]
    figures = {
        "state": states[0] if states else "?",
        "windows": len(windows),
        "wall_s": evaluate_s,
        "per_window_s": round(evaluate_s / max(1, len(windows)), 2) if evaluate_s is not None else None,
        "default_interval_s": DEFAULT_EVALUATE_INTERVAL_S,
        "requests_per_observation": round(statistics.mean(requests), 1) if requests else None,
        "runs": [{"state": st, "wall_s": w} for st, w in zip(states, walls, strict=True)],
    }
    _log(f"{label}: evaluate {figures}")
    return figures, windows, observations
