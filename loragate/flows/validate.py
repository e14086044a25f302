"""The shadow-validation gate, on the ``gpu`` work pool, triggered by ``loragate.adapter.registered``.

One run validates every pending version of a base in one batch (the base loads once), then
signs what passed with the pipeline's signing key and announces each outcome:
``loragate.adapter.validated`` triggers the canary gate;
``loragate.adapter.validation-failed`` comes with a Slack message naming the failed checks.
The reports are a Prefect table artifact. A re-run after a crash finds nothing pending and
announces again what passed but never entered canary, so the pipeline resumes -- except a
version whose canary run is already queued: in a burst, each queued validation run found
the versions earlier runs had announced and announced them again, a redundant canary run
(a process) for each.
"""

from __future__ import annotations

from prefect import flow

from loragate.flows import events
from loragate.registry.records.progress import Gate
from loragate.tasks import notify
from loragate.tasks.advance import versions_with_live_runs
from loragate.tasks.gates import sign_validated, versions_to_validate
from loragate.tasks.notify_task import notify_task
from loragate.tasks.validation.prefect_tasks import shadow_validate


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
    # the Prefect API is asked only when a version passed in an earlier run
    validated_earlier = any(v["version_id"] not in outcome for v in passed)
    queued = versions_with_live_runs(Gate.CANARY) if validated_earlier else set()
    for version in passed:
        sign_validated(version["version_id"])  # production takes a signature; canary does not
        if version["version_id"] not in queued:
            events.announce(events.VALIDATED, version["name"], version_id=version["version_id"], base=base)
        outcome.setdefault(version["version_id"], "passed")
    return outcome
