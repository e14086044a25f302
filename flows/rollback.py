"""The rollback gate: production back to ``previous`` in one pointer move, every replica
reloaded in place and verified. Pass ``expected_version`` (what production serves now) and
a re-run after a crash changes nothing once the rollback has happened."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows import events
from tasks import notify
from tasks.gates import rollback_stage, verify_stage
from tasks.notify_task import notify_task


@flow(name="rollback", log_prints=True)
def rollback_flow(
    name: str, stage: str = "production", expected_version: str | None = None, reason: str = "manual rollback"
) -> dict[str, Any]:
    moved = rollback_stage(name, stage, expected_version, reason)
    verify_stage(name, str(moved["to"]))
    if moved["moved"]:
        events.announce(events.ROLLED_BACK, name, stage=stage, version_id=moved["to"], previous=moved["from"])
        notify_task(notify.rolled_back(name, stage, moved["from"], moved["to"], reason, automatic=False))
    return moved
