"""Flows a test deploys on a warm worker's pool (``tests/test_warm_worker.py``): each records
the process and thread it ran in, so the test can tell a warm run from a process start."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from prefect import flow, suspend_flow_run


def _record(out: str, marker: str) -> None:
    with Path(out).open("a", encoding="utf-8") as f:
        f.write(f"{marker} {os.getpid()} {threading.get_ident()}\n")


@flow(name="warm-probe", log_prints=True, persist_result=False)
def warm_probe(out: str, marker: str, wait_for_lines: int = 0, deadline_s: float = 60.0, imported: str = "") -> None:
    """Record where it runs; with ``wait_for_lines``, wait (bounded) until that many runs
    have recorded: runs taken one at a time would never all get there. With ``imported``,
    the marker says whether that module was imported before the run began."""
    if imported:
        marker += "-imported" if imported in sys.modules else "-not-imported"
    _record(out, marker)
    print(f"warm probe {marker} ran")
    end = time.monotonic() + deadline_s
    while len(Path(out).read_text(encoding="utf-8").splitlines()) < wait_for_lines:
        if time.monotonic() > end:
            raise TimeoutError(f"{marker}: fewer than {wait_for_lines} runs at once")
        time.sleep(0.1)


@flow(name="warm-failing", persist_result=False)
def warm_failing(out: str) -> None:
    _record(out, "failing")
    raise ValueError("this gate failed on purpose")


@flow(name="warm-suspending", persist_result=False)
def warm_suspending(out: str) -> None:
    """Suspends once; resumed, it re-enters from the top and the answered key returns."""
    _record(out, "entered")
    suspend_flow_run(timeout=120, key="sign-off")
    _record(out, "resumed")


@flow(name="warm-busy", persist_result=False)
def warm_busy(out: str, seconds: float) -> None:
    """Works (sleeps) for ``seconds``, sending nothing of its own: only its heartbeats say it
    is alive."""
    _record(out, "busy")
    time.sleep(seconds)
