"""Golden sets attached to an adapter (the newest is current) and the validation runs of
its versions, each with its full report. A run is written inside the claim that applies its
lifecycle consequence (``ClaimedAdapter.record``), so the report and the stage move commit
together."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, insert, select, update
from sqlalchemy.engine import Connection

from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import adapter_versions, adapters, golden_sets, validation_runs
from loragate.registry.errors import NotFound
from loragate.registry.records.adapters import GoldenSetRef, ValidationRun, utcnow
from loragate.registry.records.reports import ValidationReport
from loragate.registry.rules.lifecycle import ValidationStatus


def run_from_row(row) -> ValidationRun:
    return ValidationRun(
        id=row.id,
        version_id=row.version_id,
        status=ValidationStatus(row.status),
        golden_set_digest=row.golden_set_digest,
        output_sha256=row.output_sha256,
        report=ValidationReport.from_json(row.report),
        started_at=utc(row.started_at),
        finished_at=utc(row.finished_at),
        actor=row.actor,
    )


class GoldenSetRepository:
    def __init__(self, db: Database):
        self.db = db

    def attach(self, name: str, digest: str, case_count: int, actor: str) -> GoldenSetRef:
        """Raises:
        NotFound: no such adapter.
        """
        now = utcnow()
        with self.db.write() as conn:
            adapter_id = conn.execute(select(adapters.c.id).where(adapters.c.name == name)).scalar()
            if adapter_id is None:
                raise NotFound(f"no adapter named {name!r}; register a version first", field="name")
            current = conn.execute(
                select(golden_sets).where(golden_sets.c.adapter_id == adapter_id).order_by(golden_sets.c.id.desc())
            ).first()
            if current is not None and current.digest == digest:
                # the same set again (a retried register, say): nothing to record
                return GoldenSetRef(name, digest, current.case_count, utc(current.attached_at), current.attached_by)
            conn.execute(
                insert(golden_sets).values(
                    adapter_id=adapter_id, digest=digest, case_count=case_count, attached_at=now, attached_by=actor
                )
            )
            self.db.audit(
                conn,
                actor=actor,
                action="golden_set",
                adapter_name=name,
                to_value=digest[:64],
                at=now,
                details={"cases": case_count},
            )
        return GoldenSetRef(name, digest, case_count, now, actor)

    def current(self, name: str) -> GoldenSetRef | None:
        with self.db.reader.connect() as conn:
            row = conn.execute(
                select(golden_sets)
                .join(adapters, adapters.c.id == golden_sets.c.adapter_id)
                .where(adapters.c.name == name)
                .order_by(golden_sets.c.id.desc())
                .limit(1)
            ).first()
        if row is None:
            return None
        return GoldenSetRef(name, row.digest, row.case_count, utc(row.attached_at), row.attached_by)


class ValidationRunRepository:
    def __init__(self, db: Database):
        self.db = db

    def insert(
        self,
        conn: Connection,
        version_id: str,
        report: ValidationReport,
        *,
        started_at: datetime,
        finished_at: datetime,
        actor: str,
    ) -> int:
        """Store a run and the version's validation status in the caller's transaction;
        returns the run's id."""
        run_id = conn.execute(
            insert(validation_runs)
            .values(
                version_id=version_id,
                status=report.status.value,
                golden_set_digest=report.golden_set_digest,
                output_sha256=report.output_sha256,
                report=report.to_json(),
                started_at=started_at,
                finished_at=finished_at,
                actor=actor,
            )
            .returning(validation_runs.c.id)
        ).scalar_one()
        conn.execute(
            update(adapter_versions)
            .where(adapter_versions.c.version_id == version_id)
            .values(validation_status=report.status.value)
        )
        return run_id

    def run(self, run_id: int) -> ValidationRun:
        with self.db.reader.connect() as conn:
            row = conn.execute(select(validation_runs).where(validation_runs.c.id == run_id)).first()
        return run_from_row(row)

    def runs(self, version_id: str) -> list[ValidationRun]:
        """Oldest first."""
        with self.db.reader.connect() as conn:
            rows = conn.execute(
                select(validation_runs).where(validation_runs.c.version_id == version_id).order_by(validation_runs.c.id)
            )
            return [run_from_row(r) for r in rows]

    def latest_passed_before(self, name: str, created_before: datetime, exclude_version: str) -> ValidationRun | None:
        """The newest passed run of an older version of ``name``: the drift reference."""
        with self.db.reader.connect() as conn:
            run_id = conn.execute(
                select(validation_runs.c.id)
                .select_from(
                    validation_runs.join(
                        adapter_versions, adapter_versions.c.version_id == validation_runs.c.version_id
                    ).join(adapters, adapters.c.id == adapter_versions.c.adapter_id)
                )
                .where(
                    and_(
                        adapters.c.name == name,
                        validation_runs.c.status == ValidationStatus.PASSED.value,
                        adapter_versions.c.created_at <= created_before,
                        adapter_versions.c.version_id != exclude_version,
                    )
                )
                .order_by(adapter_versions.c.created_at.desc(), validation_runs.c.id.desc())
                .limit(1)
            ).scalar()
        return self.run(run_id) if run_id is not None else None
