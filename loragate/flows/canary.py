"""The canary gates: deploy to the canary replicas, then watch on a schedule.

``canary`` (triggered by ``loragate.adapter.validated``) switches the canary replicas to the
version in place, verified against its validated outputs, and opens its window.
``canary-evaluate`` (scheduled) observes every open window once (``canary_observed_at_once``
at a time, least recently observed first, none started past ``canary_evaluate_budget_s``: a
window left is the next run's first, so a run never overlaps the next) and acts on each
verdict in that order:
out of band rolls the canary back automatically (replicas withdrawn, version
``rolled_back`` with the reason, Slack); over without the live requests a verdict needs
withdraws it the same way with its window ``undecided`` (what was missing, on Slack and in
the verdict artifact); in band for the whole window announces
``loragate.canary.ready``, which starts the promotion that waits for a sign-off. Each
window's observations are a Prefect table artifact, its verdict a markdown one. The
production replicas' live figures are read once per evaluation for every window's adapter
(``read_canary_figures``), and each window judged on its part. A live-traffic alert the
replicas raise (a tripped breaker, too many fallbacks) goes to Slack once.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.logging import get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from loragate.flows import events
from loragate.flows.traffic_watch import announce_alerts
from loragate.registry.render.canary import canary_evidence_markdown, observation_row
from loragate.registry.rules.canary import CanaryWindow, Verdict
from loragate.tasks import notify
from loragate.tasks.canary import DEFERRED
from loragate.tasks.gates import deploy_canary, observe_canary, open_canary_windows, withdraw_canary
from loragate.tasks.live_figures import LiveFigures
from loragate.tasks.naming import artifact_key
from loragate.tasks.notify_task import notify_task
from loragate.tasks.watch_tasks import read_canary_figures


def _part_of(figures: LiveFigures | None, name: str) -> Any:
    """The adapter's part of the figures, quoted (Prefect passes it unwalked and unwraps it)."""
    return None if figures is None else quote(figures.of(name))


@flow(name="canary", log_prints=True)
def canary_flow(version_id: str) -> dict[str, Any]:
    deployed = deploy_canary(version_id)
    window = deployed["window"]
    replicas = sorted({r["replica"] for r in deployed["replicas"]})
    if deployed["created"]:
        events.announce(events.CANARY_STARTED, window["adapter_name"], version_id=version_id, window_id=window["id"])
        notify_task(
            notify.canary_started(window["adapter_name"], version_id, replicas, window["thresholds"]["length_s"])
        )
    return window


@flow(name="canary-evaluate", log_prints=True)
def canary_evaluate_flow() -> dict[str, str]:
    logger = get_run_logger()
    plan = open_canary_windows()
    windows = plan.windows
    if not windows:
        logger.info("no open canary window")
    verdicts: dict[str, str] = {}
    figures = read_canary_figures(sorted({w.adapter_name for w in windows})) if windows else None
    # observed plan.at_once at a time, acted on one by one in the plan's order; each window
    # gets its adapter's part of the figures, quoted: Prefect need not walk the samples in it
    observing_runner: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=plan.at_once)
    with observing_runner:
        observing = [
            (
                window,
                observing_runner.submit(
                    observe_canary,
                    {
                        "window_id": window.id,
                        "figures": _part_of(figures, window.adapter_name),
                        "start_by": plan.start_by,
                    },
                ),
            )
            for window in windows
        ]
        for window, future in observing:
            verdicts |= _act_on(window, future.result())
    deferred = sum(1 for v in verdicts.values() if v == DEFERRED)
    if deferred:
        logger.warning(f"{deferred} of {len(windows)} windows left for the next evaluation: its budget was spent")
    return verdicts


def _act_on(window: CanaryWindow, observed: Any) -> dict[str, str]:
    """Publish one window's observation and act on its verdict; its version's verdict."""
    if observed is None:
        return {}
    if observed == DEFERRED:
        return {window.version_id: DEFERRED}
    observation, observations, alerts = observed
    announce_alerts(alerts)
    key = artifact_key("canary", window.adapter_name)
    create_table_artifact(
        key=key,
        table=[observation_row(o) for o in observations],
        description=f"Canary observations of {window.version_id} (window {window.id})",
    )
    create_markdown_artifact(
        key=f"{key}-verdict",
        markdown=f"### Verdict: **{observation.verdict.value}**\n\n"
        + "\n".join(f"- {r}" for r in observation.reasons)
        + "\n\n"
        + canary_evidence_markdown(window, observations),
        description=f"{window.adapter_name} {window.version_id}: {observation.verdict.value}",
    )
    if observation.verdict == Verdict.ROLLBACK:
        reason = "canary out of band: " + "; ".join(observation.reasons)
        withdrawn = withdraw_canary(window.id, reason)
        events.announce(events.CANARY_ROLLED_BACK, window.adapter_name, version_id=window.version_id, reason=reason)
        notify_task(
            notify.rolled_back(
                window.adapter_name, "canary", window.version_id, withdrawn["back_to"], reason, automatic=True
            )
        )
    elif observation.verdict == Verdict.UNDECIDED:
        reason = "canary undecided: " + "; ".join(observation.reasons)
        withdrawn = withdraw_canary(window.id, reason)  # its observation ended it undecided
        events.announce(events.CANARY_UNDECIDED, window.adapter_name, version_id=window.version_id, reason=reason)
        notify_task(notify.undecided(window.adapter_name, window.version_id, withdrawn["back_to"], reason))
    elif observation.verdict == Verdict.READY:
        events.announce(events.CANARY_READY, window.adapter_name, version_id=window.version_id, window_id=window.id)
    return {window.version_id: observation.verdict.value}
