"""The always-on traffic watch: every minute, every production replica read once for the
trips, fallback rates and recent requests of every adapter in production, canary window or
not (``tasks/traffic_watch.py``); then each base's busiest adapters pinned hot from those
requests (``tasks/hot_pins.py``). An alert recorded now goes to Slack once and to the run's
log; the run's ``traffic-watch`` artifact lists them, with the replicas that could not be read
and the hot pins added or removed. ``canary-evaluate`` announces the alerts of the adapters it
judges the same way (``announce_alerts``)."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from loragate.tasks import notify
from loragate.tasks.notify_task import notify_task
from loragate.tasks.watch_tasks import repin_hot_adapters, watch_fleet_traffic


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
    hot = repin_hot_adapters(watched["requests"], watched["unread_bases"])
    changed = [f"- hot pin: {name}" for name in hot["added"]] + [f"- hot pin removed: {n}" for n in hot["removed"]]
    if watched["alerts"] or watched["unreadable"] or changed:
        lines = [
            f"- **{a['kind']}** {a['name']}"
            + (f" {a['version_id']}" if a["version_id"] else "")
            + f" on {a['replica']}: {a['detail']}"
            for a in watched["alerts"]
        ] + [f"- live figures unreadable: {line}" for line in watched["unreadable"]]
        create_markdown_artifact(
            key="traffic-watch",
            markdown="### Live traffic alerts raised now\n\n"
            + ("\n".join(lines) or "(none)")
            + ("\n\n### Hot pins changed\n\n" + "\n".join(changed) if changed else ""),
            description=f"{len(watched['alerts'])} alert(s), {len(watched['unreadable'])} replica(s) unreadable, "
            f"{len(changed)} hot pin change(s)",
        )
    return {"alerts": watched["alerts"], "unreadable": watched["unreadable"], "hot_pins": hot}
