"""The always-on traffic watch: every minute, every production replica read once for the
trips and fallback rates of every adapter in production, canary window or not
(``tasks/traffic_watch.py``). An alert recorded now goes to Slack once and to the run's log;
the run's ``traffic-watch`` artifact lists them, with the replicas that could not be read.
``canary-evaluate`` announces the alerts of the adapters it judges the same way
(``announce_alerts``)."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from loragate.tasks import notify
from loragate.tasks.notify_task import notify_task
from loragate.tasks.watch_tasks import watch_fleet_traffic


def announce_alerts(alerts: list[dict[str, Any]]) -> None:
    """Each traffic alert recorded now: a warning in the run's log and one Slack message."""
    logger = get_run_logger()
    for alert in alerts:
        logger.warning("live traffic alert: %s", alert)
        notify_task(
            notify.traffic_alert(alert["name"], alert["version_id"], alert["kind"], alert["replica"], alert["detail"])
        )


@flow(name="traffic-watch", log_prints=True)
def traffic_watch_flow() -> dict[str, Any]:
    watched = watch_fleet_traffic()
    announce_alerts(watched["alerts"])
    if watched["alerts"] or watched["unreadable"]:
        lines = [
            f"- **{a['kind']}** {a['name']}"
            + (f" {a['version_id']}" if a["version_id"] else "")
            + f" on {a['replica']}: {a['detail']}"
            for a in watched["alerts"]
        ] + [f"- live figures unreadable: {line}" for line in watched["unreadable"]]
        create_markdown_artifact(
            key="traffic-watch",
            markdown="### Live traffic alerts raised now\n\n" + "\n".join(lines),
            description=f"{len(watched['alerts'])} alert(s), {len(watched['unreadable'])} replica(s) unreadable",
        )
    return watched
