"""Pointer moves for tests, through the one public path: the fleet-switching move.

The registry has no pointer move of its own that leaves replicas behind: a promotion or a
rollback is ``loragate.tasks.fleet``'s (``promote_and_switch`` / ``rollback_and_switch``),
the pointer move and its replicas' switch in one ``with``. A test without replicas takes the
same path; its fleet is simply empty. These return the move's plan, as tests compare it.
"""

from __future__ import annotations

from loragate.registry.rules.lifecycle import Plan
from loragate.registry.service import Registry
from loragate.tasks.fleet import promote_and_switch, rollback_and_switch


def promote(
    registry: Registry,
    version_id: str,
    to: str,
    reason: str | None = None,
    acknowledge_scan_review: bool = False,
    override: bool = False,
) -> Plan:
    plan, _ = promote_and_switch(
        registry, version_id, to, reason=reason, acknowledge_scan_review=acknowledge_scan_review, override=override
    )
    return plan


def rollback(
    registry: Registry,
    name: str,
    stage: str = "production",
    reason: str | None = None,
    expected_version: str | None = None,
) -> Plan:
    plan, _ = rollback_and_switch(registry, name, stage, reason=reason, expected_version=expected_version)
    return plan
