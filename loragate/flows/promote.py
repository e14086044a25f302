"""The promotion gate: a person signs the canary off, then production moves in place.

Triggered by ``loragate.canary.ready``. The run claims the window's sign-off (one waiting
run per window, even when the event arrives twice), publishes the canary evidence, sends
the UI link to Slack and waits for ``Approval`` (``flows/waiting.py``): a deployed run
suspends -- its process ends, so a sign-off that waits for days holds nothing on the
worker -- and re-enters from the top once answered, without publishing or notifying
again. The Prefect UI shows the form with the evidence as its description, and
``loragate approve`` answers the same wait from a shell. The form's approval code proves who decides: it is
redeemed before anything is recorded or moved, and a forged, expired, used or someone
else's code is refused -- as an artifact -- and the run waits again. A code presented is a
code spent: refused or not, it redeems nothing afterwards, so the form Prefect stores as
the run's input is worthless to whoever reads it back. The decision,
reviewer, comment and the token that proved it go into the audit log. A version whose
weight scan asked for review needs the approval to acknowledge it; one that does not is
refused and the run waits for a new decision. An approval moves
production and reloads every production replica in place inside a Prefect transaction:
if the check that every replica serves it fails, the transaction's rollback puts the
previous production back. A rejection withdraws the canary.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.transactions import transaction

from loragate.flows import events
from loragate.flows.approval import Approval
from loragate.flows.waiting import WaitingRun
from loragate.registry.errors import ApprovalRefused, ErrorCode, IllegalTransition
from loragate.registry.render.canary import canary_evidence_markdown
from loragate.tasks import notify
from loragate.tasks.gates import (
    canary_window_of,
    claim_approval,
    promote_production,
    record_approval,
    settings_now,
    ui_link,
    validation_evidence,
    verify_stage,
    withdraw_rejected_canary,
)
from loragate.tasks.naming import artifact_key
from loragate.tasks.notify_task import notify_task

# a run in one of these states still waits for (or acts on) its sign-off
_LIVE = {StateType.PAUSED, StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED}


def _is_live(flow_run_id: str) -> bool:
    with get_client(sync_client=True) as client:
        try:
            state_type = client.read_flow_run(UUID(flow_run_id)).state_type
        except Exception:  # deleted or unknown: nobody waits there
            return False
    return state_type is not None and state_type in _LIVE


@flow(name="promote", log_prints=True)
def promote_flow(version_id: str) -> dict[str, Any]:
    logger = get_run_logger()
    me = str(flow_run.get_id())
    window, observations, adapter = canary_window_of(version_id)
    name = window.adapter_name
    if window.promoted_already(adapter["production"]):
        logger.info(f"{version_id} is already production: nothing to do")
        return {"version_id": version_id, "decision": "already promoted"}
    holder = window.approval_flow_run_id
    if holder not in (None, me) and _is_live(holder):
        logger.info(f"flow run {holder} already waits for {version_id}'s sign-off")
        return {"version_id": version_id, "decision": f"waiting in {holder}"}
    claimed = claim_approval(window.id, me, holder)
    if claimed.approval_flow_run_id != me:
        logger.info(f"flow run {claimed.approval_flow_run_id} claimed {version_id}'s sign-off first")
        return {"version_id": version_id, "decision": f"waiting in {claimed.approval_flow_run_id}"}
    # a run that held the claim already is a suspended run re-entering: it published and notified
    reentered = holder == me

    validation, review = validation_evidence(version_id)
    evidence = canary_evidence_markdown(window, observations) + (f"\n\n{validation}" if validation else "")
    link = ui_link(me)
    if not reentered:
        create_markdown_artifact(
            key=artifact_key("approval", name), markdown=evidence, description=f"Sign-off evidence for {version_id}"
        )
        last = observations[-1] if observations else None
        summary = (
            f"{len(observations)} observation(s) in band; last: {'; '.join(last.reasons)}"
            if last
            else "no observations"
        )
        notify_task(notify.awaiting_approval(name, version_id, link, summary))
    logger.info(f"waiting for a sign-off of {version_id}: {link} or `loragate approve {version_id}`")
    settings = settings_now()
    ask = (
        f"\n\nApprove to promote `{version_id}` to production on every replica in place. "
        + f"Prove it is you: `loragate approve-code {version_id}` (add `--reject` to reject) issues a "
        + "single-use code to your own activation token; type it in `code` with your name as reviewer. "
        + f"Or from a shell in one step: `loragate approve {version_id} [--reject] [--comment ...]`."
    )
    if review is not None:
        ask += (
            f"\n\n**The weight scan asked for review**: {review}. An approval must tick "
            "`acknowledge_scan_review` (`--acknowledge-scan-review` from a shell)."
        )
    waiting = WaitingRun.read(me)

    def key(attempt: int) -> str:
        return f"approval-{window.id}" + (f"-{attempt}" if attempt else "")

    # the waits answered before are settled (each refused); the last answered one resumed this run
    answered = waiting.answered([key(n) for n in range(len(waiting.fired) + 1)])
    attempt, notice = max(0, answered - 1), ""
    while True:
        decision = waiting.wait(
            Approval.with_initial_data(description=notice + evidence + ask, approve=False),
            key=key(attempt),
            timeout_s=settings.approval_timeout_s,
            poll_s=settings.approval_poll_s,
        )
        try:
            # the code proves who decides; it is used up here, before anything moves -- and
            # spent when the decision is refused, so this input, read back and sent again, is void
            record_approval(
                window.id,
                decision.approve,
                decision.reviewer,
                decision.comment,
                decision.code,
                me,
                decision.acknowledge_scan_review,
            )
            break
        except ApprovalRefused as refusal:
            refused = f"sign-off as {decision.reviewer} refused ({refusal.code.value}): {refusal.message}"
        except IllegalTransition as unacknowledged:
            if unacknowledged.code != ErrorCode.SCAN_REVIEW_UNACKNOWLEDGED:
                raise
            # the registry would refuse the move anyway: ask again rather than fail the sign-off
            refused = f"approval by {decision.reviewer} refused: {unacknowledged.message}"
        attempt += 1
        refused += "; the code is spent: waiting for a new decision with a new code"
        notice = f"**{refused}**\n\n"
        logger.warning(refused)
        create_markdown_artifact(
            key=artifact_key("approval-refused", name), markdown=f"**{refused}**", description=refused
        )
        create_markdown_artifact(key=artifact_key("approval", name), markdown=notice + evidence, description=refused)
    logger.info(
        f"{'approved' if decision.approve else 'rejected'} by {decision.reviewer}: {decision.comment or '(no comment)'}"
    )
    if not decision.approve:
        reason = f"sign-off rejected by {decision.reviewer}: {decision.comment}"
        withdraw_rejected_canary(version_id, reason)
        events.announce(events.SIGNOFF_REJECTED, name, version_id=version_id, reviewer=decision.reviewer)
        notify_task(notify.rolled_back(name, "canary", version_id, adapter["production"], reason, automatic=False))
        return {"version_id": version_id, "decision": "rejected", "reviewer": decision.reviewer}

    reason = f"approved by {decision.reviewer}" + (f": {decision.comment}" if decision.comment else "")
    with transaction():
        promoted = promote_production(version_id, reason, decision.acknowledge_scan_review)
        verify_stage(name, version_id)
    events.announce(
        events.PROMOTED, name, version_id=version_id, previous=promoted["previous"], reviewer=decision.reviewer
    )
    notify_task(notify.promoted(name, version_id, promoted["previous"], decision.reviewer))
    return {"version_id": version_id, "decision": "approved", "reviewer": decision.reviewer, **promoted}
