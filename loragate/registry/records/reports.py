"""The shadow-validation report: one typed record per validated adapter version.

A report is what the gate decided and why: every check's verdict with its figures, the
golden cases, the outputs (what serving must reproduce), the drift against a reference
run, the comparison with production by slice, the static weight scan's verdict, and a
one-line summary. It is a registry type because the registry stores it (one
``validation_runs`` row per report) and the lifecycle reads its status; the validation
package in ``tasks/`` builds it. Its JSON form is this model's, defined here once:
``to_json`` writes it, ``from_json`` reads it back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from loragate.registry.rules.lifecycle import ValidationStatus


def json_safe(value: Any) -> Any:
    """Reports go to JSON columns (Postgres JSONB has no NaN): a non-finite figure is a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class CheckResult(BaseModel):
    """One check's verdict and its figures, flat in JSON: ``{"ok": ..., **figures}``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    ok: bool

    @model_validator(mode="before")
    @classmethod
    def _finite_figures(cls, data: Any) -> Any:
        return json_safe(data)

    @property
    def figures(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def __getitem__(self, key: str) -> Any:
        """``check["ok"]`` or one of its figures, as the JSON form reads."""
        return self.ok if key == "ok" else self.figures[key]


@dataclass(frozen=True)
class CheckVerdict:
    """A check as the gate ran it: its result and, when it failed, why (a failure line)."""

    name: str
    ok: bool
    diagnostic: str = ""
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def result(self) -> CheckResult:
        return CheckResult(ok=self.ok, **self.figures)


class BaseUnderTest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_model_id: str
    base_model_commit: str
    quantization_config: dict[str, Any] | None = None


class CaseResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: str
    completion: str
    passed: bool
    why: str


class Drift(BaseModel):
    """Golden outputs compared with a reference run: this version before, or the previous one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reference_version: str
    same_version: bool
    shared_cases: int
    changed_cases: list[str]
    mean_token_overlap_delta: float | None
    max_token_overlap_delta: float | None


class CommonNgram(BaseModel):
    """A word n-gram the failing prompts share: in how many of them, and of the others."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    failing: int
    others: int


class SliceChange(BaseModel):
    """One slice's pass rate on production (before) and on the candidate (after)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slice: str  # "overall", "intent=billing" or "intent=billing,lang=de"
    cases: int
    before: float
    after: float
    regressed: bool
    # cases of the slice production gets right and the candidate gets wrong
    failing_cases: list[str] = []
    # what those cases' prompts have in common, most distinctive first
    common_ngrams: list[CommonNgram] = []

    def describe(self) -> str:
        """``intent=refund 3/3 -> 1/3 (orders-1, orders-2; "refund my order")``"""
        before, after = round(self.before * self.cases), round(self.after * self.cases)
        line = f"{self.slice} {before}/{self.cases} -> {after}/{self.cases}"
        detail = ", ".join(self.failing_cases[:5]) + (" ..." if len(self.failing_cases) > 5 else "")
        if self.common_ngrams:
            detail += "; " + ", ".join(f'"{g.text}"' for g in self.common_ngrams)
        return f"{line} ({detail})" if detail else line


class Regression(BaseModel):
    """The candidate against the version in production, overall and slice by slice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    production_version: str | None
    epsilon: float
    # why no comparison was made (no production yet, production is this version, ...)
    skipped: str | None = None
    overall: SliceChange | None = None
    slices: list[SliceChange] = []

    @property
    def changes(self) -> list[SliceChange]:
        """Overall first, then every slice."""
        return ([self.overall] if self.overall else []) + self.slices

    @property
    def regressed(self) -> list[SliceChange]:
        return [c for c in self.changes if c.regressed]

    def describe(self) -> str:
        if self.skipped is not None:
            return f"skipped: {self.skipped}"
        regressed = self.regressed
        if not regressed:
            return f"none vs {self.production_version} ({len(self.slices)} slice(s), epsilon {self.epsilon:g})"
        return f"vs {self.production_version}: " + "; ".join(c.describe() for c in regressed)


class ScanReason(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str
    message: str


class WeightScan(BaseModel):
    """The static weight scan's verdict (adaptersentry), taken before the adapter loads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: str  # allow | review | block
    level: str
    confidence: str
    reasons: list[ScanReason]
    # what limits the verdict (no reference profile, too few modules per family, ...)
    limits: list[str] = []
    max_concentration_z: float | None = None
    scanner: str
    policy: str
    wall_time_s: float

    @property
    def under_review(self) -> bool:
        return self.action == "review"

    @property
    def notable_reasons(self) -> list[ScanReason]:
        """The reasons but the one every scan without a reference profile carries."""
        return [r for r in self.reasons if r.code != "NO_REFERENCE_PROFILE"]

    def describe(self) -> str:
        why = "; ".join(f"{r.code}: {r.message}" for r in self.notable_reasons)
        return self.action + (f" ({why})" if why else "")


class ValidationReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version_id: str | None
    name: str
    base: BaseUnderTest
    golden_set_digest: str | None
    threshold: float
    status: ValidationStatus
    checks: dict[str, CheckResult]
    # one line per failed check, ``<check>: <diagnostic naming the cause>``
    failures: list[str]
    summary: str
    cases: list[CaseResult] = []
    outputs: dict[str, str] | None = None
    output_sha256: str | None = None
    drift: Drift | None = None
    regression: Regression | None = None
    scan: WeightScan | None = None
    timing: dict[str, float] = {}
    # the validation_runs row the report was stored as; set once recorded
    run_id: int | None = None

    @classmethod
    def assemble(
        cls,
        *,
        version_id: str | None,
        name: str,
        base: BaseUnderTest,
        golden_set_digest: str | None,
        threshold: float,
        verdicts: Sequence[CheckVerdict],
        cases: Sequence[CaseResult] = (),
        outputs: Mapping[str, str] | None = None,
        output_sha256: str | None = None,
        drift: Drift | None = None,
        regression: Regression | None = None,
        scan: WeightScan | None = None,
        timing: Mapping[str, float] | None = None,
    ) -> ValidationReport:
        """A report from the checks as they ran: status, failure lines and summary follow from them."""
        failures = [f"{v.name}: {v.diagnostic}" for v in verdicts if not v.ok]
        checks = {v.name: v.result for v in verdicts}
        return cls(
            version_id=version_id,
            name=name,
            base=base,
            golden_set_digest=golden_set_digest,
            threshold=threshold,
            status=ValidationStatus.FAILED if failures else ValidationStatus.PASSED,
            checks=checks,
            failures=failures,
            summary=_summary(checks, failures, drift),
            cases=list(cases),
            outputs=dict(outputs) if outputs is not None else None,
            output_sha256=output_sha256,
            drift=drift,
            regression=regression,
            scan=scan,
            timing={k: round(v, 6) for k, v in (timing or {}).items()},
        )

    @property
    def passed(self) -> bool:
        return self.status == ValidationStatus.PASSED

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ValidationReport:
        return cls.model_validate(data)

    def recorded_as(self, run_id: int) -> ValidationReport:
        return self.model_copy(update={"run_id": run_id})


def _summary(checks: Mapping[str, CheckResult], failures: Sequence[str], drift: Drift | None) -> str:
    golden = checks.get("golden")
    if golden is not None:
        g = golden.figures
        summary = f"golden {g['passed']}/{g['total']} (threshold {g['threshold']:.2f})"
        noop = checks["noop"].figures if "noop" in checks else {}
        if "max_abs_logit_delta" in noop:
            summary += f", max logit delta {float(noop['max_abs_logit_delta']):.3g}"
        if drift is not None and drift.mean_token_overlap_delta is not None:
            summary += f", drift {drift.mean_token_overlap_delta:.2f} vs {drift.reference_version}"
        regression = checks.get("regression")
        if regression is not None and "skipped" not in regression.figures:
            regressed = len(regression.figures.get("regressed", []))
            summary += f", {regressed} slice(s) regressed vs {regression.figures.get('production_version')}"
    else:
        summary = "not run"
    scan = checks.get("scan")
    if scan is not None and scan.figures.get("action") == "review":
        summary += ", weight scan: review"
    if failures:
        names = "; ".join(f.split(":", 1)[0] for f in failures)
        summary = f"{len(failures)} check(s) failed: {names} ({summary})"
    return summary
