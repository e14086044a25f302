"""CPU replicas the kit starts yield to the control plane: each runs, with every process it
spawns (vLLM's engine core), ``REPLICA_NICENESS`` above the process that started it, so a
rollback or a worker beside busy replicas gets the cores first (issue: rollback in a
second). On the session's real replicas, and for the launcher's own child set-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loragate.local.replica import _child_setup
from loragate.local.replica_config import REPLICA_NICENESS


def _niceness_of(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_the_launchers_child_runs_its_niceness_above_ours_and_nothing_is_set_up_for_none():
    setup = _child_setup(REPLICA_NICENESS, die_with_parent=False)
    said = subprocess.run(
        [sys.executable, "-c", "import os; print(os.nice(0))"], preexec_fn=setup, capture_output=True, text=True
    )
    assert int(said.stdout) == min(19, os.nice(0) + REPLICA_NICENESS)
    assert _child_setup(0, die_with_parent=False) is None


@pytest.mark.slow
def test_every_process_of_a_real_replica_runs_at_a_lower_cpu_priority_than_its_starter(replicas):
    ours = os.nice(0)
    for key, replica in replicas.items():
        pids = [replica.process.pid, *_descendants(replica.process.pid)]
        assert len(pids) >= 2, f"{key}: the API server and its engine core"
        assert {pid: _niceness_of(pid) for pid in pids} == dict.fromkeys(pids, min(19, ours + REPLICA_NICENESS))
