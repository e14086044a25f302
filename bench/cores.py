"""Where a benchmark's processes run on a machine the replicas share with the control
plane: the replicas at a lower CPU priority, or the cores divided between the replicas
(with the clients that load them) and the control plane, as separate nodes divide a fleet.
Both act on every thread of the processes named, and undo what they did after the block.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import psutil

from loragate.local.replica import VllmReplica

# below the control plane's 0, not so low that the replicas stall while it idles
REPLICA_NICENESS = 10


def threads_of(processes: list[subprocess.Popen]) -> list[int]:
    """The thread ids of every process given and of all its descendants."""
    tids = []
    for process in processes:
        root = psutil.Process(process.pid)
        for member in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                tids += [thread.id for thread in member.threads()]
    return tids


def replica_processes(replicas: list[VllmReplica]) -> list[subprocess.Popen]:
    processes = [replica.process for replica in replicas]
    assert all(processes), "replicas not started"
    return processes  # type: ignore[return-value]


@contextlib.contextmanager
def replicas_yielding(replicas: list[VllmReplica], niceness: int = REPLICA_NICENESS) -> Iterator[int]:
    """Every thread of the replicas' processes (the API server, its engine core, their
    compute threads) at a lower CPU priority for the block: on two cores shared with the
    control plane, one way to stand in for a Prefect server and workers on nodes of their
    own. Yields how many threads it reniced; puts them back after."""
    before: dict[int, int] = {}
    for tid in threads_of(replica_processes(replicas)):
        with contextlib.suppress(OSError):
            before[tid] = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
    try:
        yield len(before)
    finally:
        for tid, niceness_before in before.items():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, niceness_before)


@contextlib.contextmanager
def cores_split(
    replicas: list[VllmReplica], control_plane: list[subprocess.Popen] | None = None
) -> Iterator[dict[str, list[int]]]:
    """The other way: the last core to the replicas (every thread, their OpenMP compute
    threads too) and to the clients that load them, the other cores to the control plane:
    the processes named (a Prefect server, a worker) and this one, whose main thread times
    the rollback and starts what it runs. What a fleet has -- replicas on nodes of their own,
    their traffic from elsewhere -- shrunk onto this machine: the control plane keeps its
    cores whatever the traffic does. Yields the split; puts back the affinity of each
    thread it moved (threads started meanwhile keep their side's). Run it last."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("bench: --split-cores needs 2 CPUs or more")
    split = {"replicas_and_clients": cpus[-1:], "control_plane": cpus[:-1]}
    before: dict[int, set[int]] = {}
    targets = [(tid, split["replicas_and_clients"]) for tid in threads_of(replica_processes(replicas))]
    own = [thread.id for thread in psutil.Process().threads()]
    targets += [(tid, split["control_plane"]) for tid in threads_of(control_plane or []) + own]
    for tid, cores in targets:
        with contextlib.suppress(OSError):
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cores)
    try:
        yield split
    finally:
        for tid, cores_before in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cores_before)
