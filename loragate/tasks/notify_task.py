"""Prefect wrapper of Slack notifications: thin, never failing a gate, never posting twice.

The notice is the only parameter: Prefect stores task parameters and shows them in its
UI, so the settings are read inside the run, from the worker's environment, and the Slack
token from the worker's secrets directory. Kept apart from ``loragate.tasks.notify`` so the plain function imports
without Prefect (~2.4 s), as ``loragate.tasks.validation`` keeps its wrapper in ``prefect_tasks``.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from loragate.tasks.credentials import slack_settings
from loragate.tasks.notify import Notice, NotifyResult, notify


# No Prefect retries, on purpose. chat.postMessage is not idempotent, and a task-level
# retry re-runs the whole post -- also after a read timeout or a dropped connection, when
# Slack may already have posted it; and to be retried the task would have to raise, which
# fails the gate that called it once the retries run out. ``notify`` already re-sends, within
# one attempt, exactly the posts Slack cannot have received (refused, DNS, connect timeout),
# and returns every other failure as ``sent=False``.
# NO_CACHE: two equal notices (a second rollback for the same reason) are two events.
@task(name="notify", retries=0, cache_policy=NO_CACHE)
def notify_task(notice: Notice) -> NotifyResult:
    """Post the notice to Slack; the result says whether it went, is off, or failed."""
    result = notify(slack_settings(), notice)
    logger = get_run_logger()
    if result.error:
        logger.warning("Slack: %s", result.one_line())
    else:
        logger.info("Slack: %s", result.one_line())
    return result
