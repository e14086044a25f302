"""The shadow-validation gate, on the ``gpu`` work pool, triggered by ``loragate.adapter.registered``.

One run validates every pending version of a base in one batch (the base loads once), then
signs what passed with the pipeline's signing key and announces each outcome:
``loragate.adapter.validated`` triggers the canary gate;
``loragate.adapter.validation-failed`` comes with a Slack message naming the failed checks.
The reports are a Prefect table artifact. A re-run after a crash finds nothing pending and
announces again what passed but never entered canary, so the pipeline resumes.
"""

from __future__ import annotations

from prefect import flow

from flows import events
from tasks import notify
from tasks.gates import sign_validated, versions_to_validate
from tasks.notify_task import notify_task
from tasks.validation.prefect_tasks import shadow_validate


@flow(name="shadow-validate", log_prints=True)
def shadow_validate_flow(base: str) -> dict[str, str]:
    pending, _ = versions_to_validate(base)
    outcome: dict[str, str] = {}
    if pending:
        for report in shadow_validate(pending):
            assert report.version_id is not None
            outcome[report.version_id] = report.status.value
            if report.status.value != "passed":
                events.announce(
                    events.VALIDATION_FAILED, report.name, version_id=report.version_id, failures=report.failures
                )
                notify_task(notify.validation_failed(report.name, report.version_id, report.failures))
    _, passed = versions_to_validate(base)
    for version in passed:
        sign_validated(version["version_id"])  # production takes a signature; canary does not
        events.announce(events.VALIDATED, version["name"], version_id=version["version_id"], base=base)
        outcome.setdefault(version["version_id"], "passed")
    return outcome
