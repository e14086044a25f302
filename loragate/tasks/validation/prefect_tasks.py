"""Prefect wrappers of shadow validation: thin, retry-free (validation records a run).

Parameters are version ids only: Prefect stores task and flow parameters and shows them
in its UI, so settings (with the database URL) are read inside the run, from the
worker's environment, and the token from the signing pool's secrets directory.
"""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.logging import get_run_logger

from loragate.registry.records.reports import ValidationReport
from loragate.registry.render.validation import report_row, validation_evidence_markdown
from loragate.registry.rules.access import Role
from loragate.registry.service import Registry
from loragate.tasks.credentials import settings_for
from loragate.tasks.naming import artifact_key
from loragate.tasks.validation.policy import ValidationPolicy
from loragate.tasks.validation.runner import validate_versions


@task(name="shadow-validate", log_prints=True)
def shadow_validate(version_ids: list[str]) -> list[ValidationReport]:
    """Validate versions, record the runs and publish them as Prefect artifacts: a summary
    table, and per adapter its checks, slices against production and weight scan. A
    failed adapter is rejected, never raised."""
    logger = get_run_logger()
    settings = settings_for(Role.SIGNING)
    with Registry.open(settings) as registry:
        reports = validate_versions(
            registry, version_ids, ValidationPolicy.from_settings(settings), progress=logger.info
        )
    create_table_artifact(
        key="shadow-validation",
        table=[report_row(r) for r in reports],
        description=f"Shadow validation of {len(reports)} adapter version(s)",
    )
    for report in reports:
        create_markdown_artifact(
            key=artifact_key("validation", report.name),
            markdown=validation_evidence_markdown(report),
            description=f"Shadow validation of {report.version_id}: {report.status.value}",
        )
    return reports
