"""The rollback gate: production back to ``previous`` in one pointer move (or the canary
withdrawn), every replica reloaded in place and verified.

Whoever reaches the Prefect API can start this deployment, so it moves nothing without a
rollback code a person got for the version the stage serves: ``loragate approve-code
VERSION --rollback`` issues it to their own activation token. The code is redeemed before
anything moves; a missing, forged, used, expired or mismatched one fails the run, with the
refusal as an artifact and in the audit log. Pass ``expected_version`` (what the stage
serves now) and a re-run after a crash changes nothing, and needs no code, once the
rollback has happened. (``loragate rollback`` with an activation token needs no code: the
token is the proof.)
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from loragate.flows import events
from loragate.registry.errors import ApprovalRefused
from loragate.tasks import notify
from loragate.tasks.gates import authorize_rollback, rollback_stage, verify_stage
from loragate.tasks.naming import artifact_key
from loragate.tasks.notify_task import notify_task


@flow(name="rollback", log_prints=True)
def rollback_flow(
    name: str,
    stage: str = "production",
    expected_version: str | None = None,
    reason: str = "manual rollback",
    code: str = "",
) -> dict[str, Any]:
    try:
        proven = authorize_rollback(name, stage, expected_version, code, str(flow_run.get_id()))
    except ApprovalRefused as refused:
        why = f"rollback of {name} {stage} refused ({refused.code.value}): {refused.message}"
        create_markdown_artifact(key=artifact_key("rollback-refused", name), markdown=f"**{why}**", description=why)
        raise
    if proven is None:
        return {"name": name, "stage": stage, "from": expected_version, "moved": False}
    reason = f"{reason} (asked by {proven['reviewer']}, token {proven['token_id']})"
    moved = rollback_stage(name, stage, proven["version_id"], reason)
    verify_stage(name, str(moved["to"]))
    if moved["moved"]:
        events.announce(events.ROLLED_BACK, name, stage=stage, version_id=moved["to"], previous=moved["from"])
        notify_task(notify.rolled_back(name, stage, moved["from"], moved["to"], reason, automatic=False))
    return moved
