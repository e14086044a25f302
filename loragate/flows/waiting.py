"""How a gate waits for a person without holding a worker.

A run started from a deployment *suspends*: ``suspend_flow_run`` ends its process, so a
sign-off that waits for days holds no process, connection or memory on the worker.
Resuming it (the UI's form, ``loragate approve``) schedules it again on its pool, where it
re-enters its flow from the top: every step before the wait is idempotent, so re-entering
costs a few reads. Each wait of a run has its own key, and Prefect remembers the keys
that fired: on re-entry a wait that was answered returns its answer instead of waiting
again, and ``answered`` tells the flow how many of its waits were answered, so it
replays only the answer that resumed it.

A run with no deployment (a flow called in-process: a test, a notebook) has nothing that
could start it again: it pauses in place, its process waiting, with the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

from prefect import pause_flow_run, suspend_flow_run
from prefect.client.orchestration import get_client
from prefect.input import RunInput

Form = TypeVar("Form", bound=RunInput)


@dataclass(frozen=True)
class WaitingRun:
    """What decides how a flow run waits: whether anything can start it again, and which
    of its waits were answered (their keys fired)."""

    suspends: bool
    fired: frozenset[str]

    @classmethod
    def read(cls, flow_run_id: str) -> WaitingRun:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(flow_run_id))
        return cls(run.deployment_id is not None, frozenset(run.empirical_policy.pause_keys or ()))

    def answered(self, keys: list[str]) -> int:
        """How many of ``keys``, in order, have fired: the waits behind the flow."""
        count = 0
        while count < len(keys) and keys[count] in self.fired:
            count += 1
        return count

    def wait(self, form: type[Form], *, key: str, timeout_s: float, poll_s: float) -> Form:
        """The person's answer to ``form``: suspended (the process ends here and the run
        re-enters from the top once answered) or paused in place; an answered ``key``
        returns its answer at once. Fails the run (``FlowPauseTimeout`` or the server's
        pause expiry) when nobody answers within ``timeout_s``."""
        if self.suspends:
            return suspend_flow_run(wait_for_input=form, timeout=int(timeout_s), key=key)
        return pause_flow_run(wait_for_input=form, timeout=int(timeout_s), poll_interval=int(max(1, poll_s)), key=key)
