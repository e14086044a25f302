"""The checks of the shadow-validation gate: one function each, and the table of them.

A check looks at a ``Trial`` -- one adapter on the loaded base, filled in as the gate
runs -- and returns its verdict, or ``None`` when it does not apply. ``CHECKS`` lists
them in the order they run and the phase that must be done before each: static checks
need only the files, the load check needs the adapter attached, output checks need the
greedy generations of the adapter and of the bare base.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from loragate.registry.intake.binding import binding_mismatches
from loragate.registry.intake.golden import GoldenSet
from loragate.registry.intake.weights import ValueScan, WeightsSummary
from loragate.registry.records.bases import BaseModelRecord
from loragate.registry.records.reports import CaseResult, CheckVerdict, Drift, Regression, WeightScan
from loragate.tasks.validation.policy import ValidationPolicy
from loragate.tasks.validation.session import Attachment, Generation


@dataclass(frozen=True)
class Reference:
    """Earlier golden outputs to compare with: a previous version, or this one before."""

    version_id: str
    outputs: dict[str, str]
    output_sha256: str | None
    golden_set_digest: str | None
    same_version: bool


@dataclass(frozen=True)
class Baseline:
    """The version in production, to run the same golden set on for the regression check;
    ``skipped`` says why there is none to compare with."""

    version_id: str | None
    bundle_dir: Path | None = None
    skipped: str | None = None
    # production exists but cannot be compared with: the check fails
    error: str | None = None


@dataclass
class AdapterUnderTest:
    name: str
    bundle_dir: Path
    manifest: dict[str, Any]
    golden: GoldenSet
    version_id: str | None = None
    reference: Reference | None = None
    production: Baseline | None = None


@dataclass
class Trial:
    """One adapter on the loaded base: what the checks look at, filled in as the gate runs."""

    target: AdapterUnderTest
    base: BaseModelRecord
    quantization_config: dict[str, Any] | None
    policy: ValidationPolicy
    structure: WeightsSummary | None = None
    structure_error: str | None = None
    scan: ValueScan | None = None
    weight_scan: WeightScan | None = None
    adapter_config: dict[str, Any] = field(default_factory=dict)
    attachment: Attachment | None = None
    attach_error: str | None = None
    loaded: dict[str, Any] | None = None
    base_run: Generation | None = None
    run: Generation | None = None
    cases: list[CaseResult] = field(default_factory=list)
    # golden cases the bare base itself passes: a set it passes does not discriminate
    base_passed: int = 0
    drift: Drift | None = None
    regression: Regression | None = None
    # why the regression check could not compare (production failed to load, ...)
    regression_error: str | None = None


class Phase(Enum):
    STATIC = "static"  # the files only
    LOAD = "load"  # the adapter attached (or refused by PEFT)
    OUTPUTS = "outputs"  # greedy generations of the adapter and of the bare base


def check_rank(t: Trial) -> CheckVerdict:
    rank, limit = t.target.manifest.get("lora_rank"), t.policy.max_lora_rank
    return CheckVerdict(
        "rank",
        isinstance(rank, int) and rank <= limit,
        f"lora_rank {rank} is above the fleet's max_lora_rank {limit}",
        {"lora_rank": rank, "max_lora_rank": limit},
    )


def check_binding(t: Trial) -> CheckVerdict:
    wrong = binding_mismatches(t.target.manifest, t.base)
    return CheckVerdict("binding", not wrong, "; ".join(m.describe(t.base) for m in wrong), {"base": t.base.label})


def check_weights(t: Trial) -> CheckVerdict:
    if t.structure is None or t.scan is None:
        return CheckVerdict("weights", False, t.structure_error or "the weights file could not be read")
    problem = t.scan.problem()
    return CheckVerdict(
        "weights",
        problem is None,
        problem or "",
        {
            "lora_tensors_in_file": len(t.structure.tensors),
            "lora_params_in_file": t.structure.parameter_count,
            "nonfinite_tensors": list(t.scan.nonfinite_tensors[:5]),
            "adapter_config_lora_alpha": t.adapter_config.get("lora_alpha"),
        },
    )


def check_scan(t: Trial) -> CheckVerdict | None:
    """adaptersentry's verdict: ``block`` fails the gate; ``review`` passes it, recorded,
    and production then needs an explicit acknowledgement."""
    ws = t.weight_scan
    if ws is None:
        return None
    blocking = [f"{r.code}: {r.message}" for r in ws.notable_reasons]
    return CheckVerdict(
        "scan",
        ws.action != "block",
        f"{ws.scanner} blocks the adapter: " + "; ".join(blocking),
        {
            "action": ws.action,
            "confidence": ws.confidence,
            "max_concentration_z": ws.max_concentration_z,
            "reasons": [r.code for r in ws.reasons],
        },
    )


def check_load(t: Trial) -> CheckVerdict:
    """What PEFT holds must be exactly the file: nothing dropped, missing, on meta or changed."""
    if t.attach_error is not None:
        return CheckVerdict("load", False, f"PEFT refused the adapter: {t.attach_error}")
    assert t.loaded is not None and t.attachment is not None and t.structure is not None
    loaded = dict(t.loaded)
    loaded["mode"] = t.attachment.mode
    if t.attachment.unexpected_keys is not None:
        loaded["peft_reported_unexpected"] = t.attachment.unexpected_keys
        loaded["peft_reported_missing"] = t.attachment.missing_keys
    reasons = []
    if loaded["unexpected_count"]:
        reasons.append(
            f"{loaded['unexpected_count']} tensors in the file were dropped, e.g. {loaded['unexpected_keys'][0]} "
            "(target_modules lists fewer modules than the file holds, or the base has fewer layers)"
        )
    if loaded["missing_count"]:
        reasons.append(
            f"{loaded['missing_count']} LoRA tensors never loaded, e.g. {loaded['missing_keys'][0]} "
            "(renamed or stripped key prefix)"
        )
    if loaded["meta_count"]:
        reasons.append(f"{loaded['meta_count']} LoRA parameters left on the meta device")
    if loaded["differing_values"]:
        reasons.append(f"loaded values differ from the file for {loaded['differing_values'][0]}")
    expected = t.structure.parameter_count
    if not reasons and not (loaded["lora_params_loaded"] == expected and expected > 0):
        reasons.append(f"LoRA parameter count {loaded['lora_params_loaded']} != {expected} in the file")
    return CheckVerdict("load", not reasons, "; ".join(reasons), loaded)


def check_finite(t: Trial) -> CheckVerdict:
    assert t.run is not None
    dtype = f" under compute dtype {t.quantization_config['bnb_4bit_compute_dtype']}" if t.quantization_config else ""
    return CheckVerdict(
        "finite",
        t.run.nonfinite_logits == 0,
        f"{t.run.nonfinite_logits} non-finite logits on the golden prompts{dtype}",
        {"nonfinite_logits": t.run.nonfinite_logits},
    )


def check_noop(t: Trial) -> CheckVerdict:
    """The adapter must move the base's logits: alpha 0, zero B and missed keys do not."""
    assert t.run is not None and t.base_run is not None
    delta = (t.run.first_logits - t.base_run.first_logits).abs()
    max_delta = float(delta.nan_to_num(nan=float("inf")).max()) if delta.numel() else 0.0
    tolerance = t.policy.noop_tolerance
    same_as_base = sum(t.run.texts[c.id] == t.base_run.texts[c.id] for c in t.target.golden.cases)
    return CheckVerdict(
        "noop",
        max_delta > tolerance,
        f"the adapter changes logits by at most {max_delta:.2e} (tolerance {tolerance:.0e}): it has no effect; "
        "check lora_alpha, the lora_B weights and the key prefix",
        {"max_abs_logit_delta": max_delta, "tolerance": tolerance, "completions_equal_to_base": same_as_base},
    )


def check_golden(t: Trial) -> CheckVerdict:
    passed, total = sum(c.passed for c in t.cases), len(t.cases)
    rate = passed / total if total else 0.0
    threshold = t.policy.pass_threshold
    return CheckVerdict(
        "golden",
        rate >= threshold,
        f"passed {passed}/{total} golden cases ({rate:.2f} < {threshold:.2f})",
        {
            "passed": passed,
            "total": total,
            "pass_rate": rate,
            "threshold": threshold,
            "base_pass_rate": t.base_passed / total if total else 0.0,
        },
    )


def check_reproducible(t: Trial) -> CheckVerdict | None:
    """Same weights, same prompts, greedy decoding: any change is the base or the runtime."""
    ref = t.target.reference
    if t.drift is None or ref is None or not ref.same_version or ref.golden_set_digest != t.target.golden.digest:
        return None
    changed = t.drift.changed_cases
    return CheckVerdict(
        "reproducible",
        not changed,
        f"{len(changed)} golden outputs changed since this version's last passed run "
        f"(e.g. {changed[:1]}): the base or the runtime drifted",
        {"changed_cases": len(changed)},
    )


def check_regression(t: Trial) -> CheckVerdict | None:
    """No slice (nor the whole set) may pass less often than on production, by more than
    epsilon; skipped, and saying why, when there is no production to compare with."""
    if t.regression_error is not None:
        return CheckVerdict("regression", False, t.regression_error)
    r = t.regression
    if r is None:
        return None
    if r.skipped is not None:
        return CheckVerdict("regression", True, "", {"skipped": r.skipped})
    regressed = r.regressed
    return CheckVerdict(
        "regression",
        not regressed,
        f"worse than production {r.production_version} (epsilon {r.epsilon:g}): "
        + "; ".join(c.describe() for c in regressed),
        {
            "production_version": r.production_version,
            "epsilon": r.epsilon,
            "slices": len(r.slices),
            "regressed": [c.slice for c in regressed],
        },
    )


@dataclass(frozen=True)
class CheckSpec:
    name: str
    phase: Phase
    run: Callable[[Trial], CheckVerdict | None]
    catches: str


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("rank", Phase.STATIC, check_rank, "rank above the fleet's max_lora_rank"),
    CheckSpec("binding", Phase.STATIC, check_binding, "manifest bound to another base id/commit/config/tokenizer/RoPE"),
    CheckSpec("weights", Phase.STATIC, check_weights, "NaN/Inf tensors (CPU SDPA hides them), all-zero lora_B"),
    CheckSpec("scan", Phase.STATIC, check_scan, "a module's update concentrated on a few outputs (planted behaviour)"),
    CheckSpec("load", Phase.LOAD, check_load, "what PEFT loaded differs from the file, or PEFT refused it"),
    CheckSpec("finite", Phase.OUTPUTS, check_finite, "non-finite logits in a padded batch (float16 overflow)"),
    CheckSpec("noop", Phase.OUTPUTS, check_noop, "an adapter that does not move the base's logits"),
    CheckSpec("golden", Phase.OUTPUTS, check_golden, "golden pass rate below the threshold"),
    CheckSpec("reproducible", Phase.OUTPUTS, check_reproducible, "this version's outputs changed: base/runtime drift"),
    CheckSpec("regression", Phase.OUTPUTS, check_regression, "a slice production gets right that this version breaks"),
)


def run_checks(trial: Trial, phase: Phase) -> list[CheckVerdict]:
    verdicts = []
    for spec in CHECKS:
        if spec.phase == phase:
            verdict = spec.run(trial)
            if verdict is not None:
                verdicts.append(verdict)
    return verdicts
