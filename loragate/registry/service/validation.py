"""Golden sets and validation runs: the set attached to an adapter now (checked by the
great-expectations suite when attached), the reports shadow validation records (a failed
staging version becomes ``rejected`` in the same transaction), the reference a new run is
compared with, and whether the latest run's weight scan asked for review."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from loragate.registry.errors import ErrorCode, NotFound
from loragate.registry.intake.golden import GoldenSet, digest_if_parseable, load_stored_golden_set, parse_golden_set
from loragate.registry.records.adapters import AdapterVersion, GoldenSetRef, ValidationRun
from loragate.registry.records.reports import ValidationReport, WeightScan
from loragate.registry.rules.access import Action
from loragate.registry.rules.lifecycle import ValidationStatus, plan_validation_result
from loragate.registry.rules.names import AdapterName
from loragate.registry.service.base import RegistryBase
from loragate.registry.storage.bundle_files import read_regular_file


class ValidationMixin(RegistryBase):
    def attach_golden_set(self, name: str, path: Path) -> GoldenSetRef:
        """Check a golden set (JSONL) and attach it to ``name``.

        Raises:
            InvalidInput: INVALID_GOLDEN_SET naming every failed expectation, TOO_LARGE,
                INVALID_BUNDLE for a path that is not a regular file.
            NotFound: no such adapter.
        """
        AdapterName.parse(name)
        self._store.pointers.adapter(name)
        actor = self._authorize(Action.REGISTER, name)
        raw = read_regular_file(
            Path(path), self.settings.max_json_bytes, field="golden_set", code=ErrorCode.INVALID_GOLDEN_SET
        )
        current = self._store.golden.current(name)
        if current is not None and digest_if_parseable(raw, self.settings.golden_max_cases) == current.digest:
            # the set attached now, checked when it was attached: a training job sends it with
            # every version, and the great-expectations suite costs ~2 s in a fresh process
            return current
        golden = parse_golden_set(
            raw, min_cases=self.settings.golden_min_cases, max_cases=self.settings.golden_max_cases
        )
        self._artifacts.put_bytes(golden.digest, golden.canonical_bytes())
        return self._store.golden.attach(name, golden.digest, len(golden.cases), actor)

    def golden_set(self, name: str) -> tuple[GoldenSetRef, GoldenSet]:
        """The golden set attached to ``name`` now.

        Raises:
            NotFound: no such adapter, or no golden set attached.
            IntegrityFailure: the stored set no longer matches its digest.
        """
        ref = self._store.golden.current(name)
        if ref is None:
            self._store.pointers.adapter(name)
            raise NotFound(f"{name} has no golden set attached (loragate golden set {name} FILE)", field="golden_set")
        return ref, load_stored_golden_set(self._artifacts.read_bytes(ref.digest), ref.digest)

    def record_validation(
        self, version_id: str, report: ValidationReport, started_at: datetime, finished_at: datetime
    ) -> ValidationRun:
        """Store a validation report; a failed staging version becomes ``rejected``.

        Raises:
            NotFound: no such version.
        """
        actor = self._authorize(Action.VALIDATE, self._store.versions.get(version_id).name)
        details = {
            "status": report.status.value,
            "output_sha256": report.output_sha256,
            "golden_set": report.golden_set_digest,
        }

        def attempt() -> int:
            # the run, the version's status and its lifecycle consequence commit together
            with self._store.pointers.claim(subject=version_id) as claim:
                plan = plan_validation_result(claim.states[version_id], report.status)
                claim.apply(plan, actor=actor, reason=report.summary, details=details)
                return claim.record(
                    lambda conn: self._store.validation.insert(
                        conn, version_id, report, started_at=started_at, finished_at=finished_at, actor=actor
                    )
                )

        return self._store.validation.run(self._store.db.retrying(attempt))

    def validation_runs(self, version_id: str) -> list[ValidationRun]:
        return self._store.validation.runs(version_id)

    def reference_run_for(self, version: AdapterVersion) -> ValidationRun | None:
        """What a new validation of ``version`` is compared with: its own last passed run
        (reproducibility), else the newest passed run of an older version (drift)."""
        own = [r for r in self._store.validation.runs(version.version_id) if r.status == ValidationStatus.PASSED]
        if own:
            return own[-1]
        return self._store.validation.latest_passed_before(version.name, version.created_at, version.version_id)

    def scan_under_review(self, version_id: str) -> WeightScan | None:
        """The weight scan of the version's latest validation when it asked for review
        (None when it did not, or no scan ran).

        Raises:
            NotFound: no such version.
        """
        self._store.versions.get(version_id)
        runs = self._store.validation.runs(version_id)
        scan = runs[-1].report.scan if runs else None
        return scan if scan is not None and scan.under_review else None
