"""Where each version waits in the pipeline, as the registry reads it: the gate that should
act on it next and since when it has waited. The pipeline's events drive the gates; this
is what the scheduled ``advance`` sweep and ``loragate status`` read, so that an event lost
or an action that failed never leaves a version stuck for good."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Gate(StrEnum):
    """The gate (its deployment's flow) a waiting version needs next."""

    VALIDATE = "shadow-validate"  # registered, not yet validated
    CANARY = "canary"  # validated, never deployed to the canary
    SIGN_OFF = "promote"  # its canary window is ready, waiting for a sign-off run


@dataclass(frozen=True)
class Waiting:
    gate: Gate
    version_id: str
    adapter_name: str
    base: str
    since: datetime  # registered / validated / became ready
    window_id: int | None = None
    approval_flow_run_id: str | None = None  # SIGN_OFF: the run that claimed it, if any

    def waited_s(self, now: datetime) -> float:
        return (now - self.since).total_seconds()

    def as_dict(self, now: datetime) -> dict[str, object]:
        return {
            "gate": self.gate.value,
            "version_id": self.version_id,
            "adapter_name": self.adapter_name,
            "base": self.base,
            "since": self.since.isoformat(),
            "waited_s": round(self.waited_s(now), 1),
            "window_id": self.window_id,
            "approval_flow_run_id": self.approval_flow_run_id,
        }
