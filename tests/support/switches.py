"""A replica switch that records what the pointer move asked of it, for the tests of the
move's one undo (``Registry.pointer_move`` reverts its switch, once, when it does not
commit). It moves no replica: a test of the move without replicas that needs no record
passes the named seam ``NO_REPLICAS`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loragate.registry.rules.lifecycle import Plan


class SwitchFailed(Exception):
    """What a failing switch, or a failing block, raises in these tests."""


@dataclass
class RecordingSwitch:
    """Records each ``apply`` (the plan) and ``revert``; ``fails`` makes ``apply`` raise
    ``SwitchFailed`` after recording, as a replica that could not be switched does."""

    report: list[dict[str, Any]] = field(default_factory=list)
    fails: bool = False
    applied: list[Plan] = field(default_factory=list)
    reverted: int = 0

    def apply(self, plan: Plan) -> list[dict[str, Any]]:
        self.applied.append(plan)
        if self.fails:
            raise SwitchFailed("a replica could not be switched")
        return list(self.report)

    def revert(self) -> None:
        self.reverted += 1
