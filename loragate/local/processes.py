"""Stopping a process we started, by its PID, without ever signalling a stranger.

A PID names a process only until that process exits and is reaped; then the kernel may give
it to any other process. So a process we mean to stop later is remembered by its PID *and*
its creation time (``ProcessIdentity``): a stop first checks that the PID still names a
process created at that time, and leaves whatever else holds it alone.

The stop itself terminates the process and its descendants (vLLM's API server forks an
engine core), waits for them up to a deadline, and kills what is still there. The snapshot
of descendants is taken before the first signal: once the leader is gone, its children are
re-parented and no longer found under it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from enum import StrEnum

import psutil

# psutil derives a creation time from the boot time and the process's start in clock
# ticks; the boot time is read to the second and shifts when the clock is stepped, so two
# readings of one process can differ slightly. A reused PID belongs to a process started
# later than the one recorded, almost always by far more than this.
CREATE_TIME_TOLERANCE_S = 1.0
# after SIGKILL the kernel frees a process at once; only reaping can lag
KILL_WAIT_S = 5.0
# how often a wait looks again
POLL_S = 0.1


class Stopped(StrEnum):
    """What a stop found and did."""

    TERMINATED = "terminated"
    # still there after the grace period: SIGKILL-ed
    KILLED = "killed"
    ALREADY_GONE = "already gone"
    # the PID now names a process created at another time: not ours, left alone
    PID_REUSED = "pid reused by another process, left alone"


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """The identity of the live (or not yet reaped) process ``pid``; raises
        ``psutil.NoSuchProcess`` when there is none."""
        return cls(pid, psutil.Process(pid).create_time())

    def find(self) -> psutil.Process | None:
        """The process this identity names, or None when the PID is free or held by another."""
        try:
            process = psutil.Process(self.pid)
            created = process.create_time()
        except psutil.NoSuchProcess:
            return None
        return process if abs(created - self.create_time) <= CREATE_TIME_TOLERANCE_S else None


def stop_process_tree(identity: ProcessIdentity, grace_s: float = 30.0) -> Stopped:
    """SIGTERM the process ``identity`` names and its descendants, wait up to ``grace_s``
    for them to exit, SIGKILL the ones left. A process that is gone, or a PID that now names
    another process, is not signalled at all.

    When the process is our own child it is reaped here (``psutil`` waits on it).
    """
    leader = identity.find()
    if leader is None:
        return Stopped.PID_REUSED if psutil.pid_exists(identity.pid) else Stopped.ALREADY_GONE
    members = [leader]
    with contextlib.suppress(psutil.NoSuchProcess):  # exited since: nothing under it to find
        members += leader.children(recursive=True)
    for process in members:
        # psutil re-checks the creation time before it signals: a member that exited in
        # the meantime is skipped, never a stranger that took its PID
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    alive = _wait_for_exit(members, grace_s)
    if not alive:
        return Stopped.TERMINATED
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    _wait_for_exit(alive, KILL_WAIT_S)
    return Stopped.KILLED


def _wait_for_exit(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after up to ``timeout_s``.

    ``psutil.wait_procs`` reaps our own children; a zombie whose parent is another process
    counts as exited here (``wait_procs`` alone would wait it out: reaping it is its
    parent's job, and a container's PID 1 may never do it).
    """
    deadline = time.monotonic() + timeout_s
    alive = processes
    while True:
        _, alive = psutil.wait_procs(alive, timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
        alive = [p for p in alive if not _exited(p)]
        if not alive or time.monotonic() >= deadline:
            return alive


def _exited(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
