"""The sweep that makes the pipeline level-triggered (``tasks/advance.py``): scheduled, it
crashes the runs whose process is gone (``tasks/unresponsive.py``: RUNNING, silent past
``LORAGATE_UNRESPONSIVE_AFTER_S``; table artifact ``unresponsive``), then reads which
versions wait between gates and starts the run each one's lost event would have started.
Its table artifact ``advance`` lists every waiting version and what the sweep did; a
version waiting longer than ``LORAGATE_STUCK_ALERT_S`` is also sent to Slack and logged as
a warning (``loragate status`` shows the same from a shell).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger

from loragate.tasks import notify
from loragate.tasks.advance import advance_waiting_versions
from loragate.tasks.gates import settings_now
from loragate.tasks.notify_task import notify_task
from loragate.tasks.unresponsive import crash_silent_runs_task


@flow(name="advance", log_prints=True)
def advance_flow(after_s: float | None = None) -> list[dict[str, Any]]:
    """``after_s``: act on versions waiting this long (default LORAGATE_ADVANCE_AFTER_S)."""
    logger = get_run_logger()
    settings = settings_now()
    after = settings.advance_after_s if after_s is None else after_s
    # first: a dead run would count as live below, and its version would wait forever
    silent = crash_silent_runs_task(settings.unresponsive_after_s)
    if silent:
        create_table_artifact(key="unresponsive", table=silent, description="Flow runs whose process is gone")
    for run in silent:
        outcome = "crashed" if run["crashed"] else "left as it is (it ended meanwhile)"
        silent_for = f"{run['silent_for_s']:g} s"
        logger.warning(f"flow run {run['flow_run']} ({run['flow_run_id']}) sent nothing for {silent_for}: {outcome}")
    rows = advance_waiting_versions(after, settings.stuck_alert_s)
    if rows:
        create_table_artifact(key="advance", table=rows, description="Versions waiting between gates")
    for row in rows:
        line = f"{row['version_id']} waits for {row['deployment']} ({row['waited_s']:g} s): {row['action']}"
        if row["alert"]:
            logger.warning(f"stuck: {line}")
            notify_task(
                notify.stuck(row["adapter_name"], row["version_id"], row["gate"], row["waited_s"], row["action"])
            )
        else:
            logger.info(line)
    return rows
