"""Running the gate: one adapter, a batch on one base, registered versions end to end.

``validate_versions`` is what ``loragate validate`` and the Prefect task call: it refuses
bad input (unknown version, no golden set) before any model loads, materializes each
version, groups them by (base, quantization) so each base loads once, runs the checks,
and records every report in the registry.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loragate.registry.digests import canonical_json, canonical_sha256
from loragate.registry.errors import LoragateError
from loragate.registry.intake.golden import GoldenSet, match_case
from loragate.registry.intake.weights import read_lora_structure, scan_lora_values
from loragate.registry.progress import Progress, quiet
from loragate.registry.records.adapters import AdapterVersion, ValidationRun, utcnow
from loragate.registry.records.bases import BaseModelRecord
from loragate.registry.records.reports import BaseUnderTest, CaseResult, CheckVerdict, Drift, ValidationReport
from loragate.registry.rules.lifecycle import Pointer
from loragate.registry.service import Registry
from loragate.registry.storage.bundle_files import ADAPTER_CONFIG_FILE, MANIFEST_FILE, WEIGHTS_FILE
from loragate.registry.storage.scratch import scratch_dir
from loragate.tasks.validation.checks import AdapterUnderTest, Baseline, Phase, Reference, Trial, run_checks
from loragate.tasks.validation.policy import ValidationPolicy
from loragate.tasks.validation.regression import compare_with_production, skipped
from loragate.tasks.validation.scan import scan_weights
from loragate.tasks.validation.session import BaseSession


def token_overlap_delta(a: list[int], b: list[int]) -> float:
    """1 - multiset overlap of two token sequences (0: same tokens, 1: disjoint)."""
    if not a and not b:
        return 0.0
    common = sum((Counter(a) & Counter(b)).values())
    return 1.0 - common / max(len(a), len(b))


def reference_from_run(run: ValidationRun | None, same_version: bool) -> Reference | None:
    if run is None or not run.report.outputs:
        return None
    return Reference(
        version_id=run.version_id,
        outputs=run.report.outputs,
        output_sha256=run.output_sha256,
        golden_set_digest=run.golden_set_digest,
        same_version=same_version,
    )


def _drift(session: BaseSession, trial: Trial) -> Drift | None:
    ref, run = trial.target.reference, trial.run
    if ref is None or run is None:
        return None
    shared = [c for c in trial.target.golden.cases if c.id in ref.outputs]
    deltas = {c.id: token_overlap_delta(session.tokens(ref.outputs[c.id]), run.token_ids[c.id]) for c in shared}
    return Drift(
        reference_version=ref.version_id,
        same_version=ref.same_version,
        shared_cases=len(shared),
        changed_cases=sorted(cid for cid in deltas if ref.outputs[cid] != run.texts[cid]),
        mean_token_overlap_delta=(sum(deltas.values()) / len(deltas)) if deltas else None,
        max_token_overlap_delta=max(deltas.values()) if deltas else None,
    )


class _BaselineUnavailable(Exception):
    """Production could not be run for the comparison (it failed to load cleanly)."""


def _baseline_results(session: BaseSession, baseline: Baseline, golden: GoldenSet) -> dict[str, bool]:
    """Which golden cases production gets right, run in the live slot of the same session
    (a hotswap when the layers match: no second base load); once per version and set."""
    from safetensors.torch import load_file

    assert baseline.version_id is not None and baseline.bundle_dir is not None
    key = (baseline.version_id, golden.digest)
    if key in session.baseline_results:
        return session.baseline_results[key]
    bundle = Path(baseline.bundle_dir)
    tensors = load_file(str(bundle / WEIGHTS_FILE))
    try:
        session.attach(bundle, json.loads((bundle / ADAPTER_CONFIG_FILE).read_text()), tensors)
    except Exception as e:  # PEFT raises plain exceptions on adapters it refuses
        session.detach()
        raise _BaselineUnavailable(
            f"production {baseline.version_id} could not be loaded: {type(e).__name__}: {e}"
        ) from e
    state = session.loaded_state(tensors)
    assert session.live is not None
    session.live.healthy = not (
        state["missing_count"] or state["unexpected_count"] or state["meta_count"] or state["differing_values"]
    )
    if not session.live.healthy:
        counts = ", ".join(f"{k} {state[k]}" for k in ("missing_count", "unexpected_count", "meta_count") if state[k])
        raise _BaselineUnavailable(
            f"production {baseline.version_id} did not load cleanly: {counts or 'values differ from its file'}"
        )
    run = session.generate(golden)
    results = {c.id: match_case(c, run.texts[c.id])[0] for c in golden.cases}
    session.baseline_results[key] = results
    return results


def _regression(session: BaseSession, trial: Trial) -> None:
    baseline, epsilon = trial.target.production, trial.policy.regression_epsilon
    if baseline is None:
        return
    if baseline.skipped is not None:
        trial.regression = skipped(baseline.skipped, epsilon, baseline.version_id)
        return
    if baseline.error is not None:
        trial.regression_error = baseline.error
        return
    assert baseline.version_id is not None
    try:
        production = _baseline_results(session, baseline, trial.target.golden)
    except _BaselineUnavailable as e:
        trial.regression_error = str(e)
        return
    trial.regression = compare_with_production(
        trial.target.golden.cases,
        {c.id: c.passed for c in trial.cases},
        production,
        production_version=baseline.version_id,
        epsilon=epsilon,
    )


def validate_adapter(session: BaseSession, target: AdapterUnderTest, policy: ValidationPolicy) -> ValidationReport:
    """Run every check on one adapter, attached to the session's base for the duration.

    The weight scan runs before the adapter loads, and a ``block`` stops it there. After
    the adapter's own golden run, production runs the same set in the same slot for the
    regression check."""
    from safetensors.torch import load_file

    started = time.perf_counter()
    timing: dict[str, float] = {}
    trial = Trial(target, session.record, session.quantization_config, policy)
    bundle = Path(target.bundle_dir)
    weights_path = bundle / WEIGHTS_FILE
    try:
        trial.structure = read_lora_structure(weights_path)
        trial.scan = scan_lora_values(weights_path, (trial.structure.tensors, trial.structure.data_start))
        # PEFT's in-memory config goes stale after a hotswap: the file on disk is the truth
        trial.adapter_config = json.loads((bundle / ADAPTER_CONFIG_FILE).read_text())
    except LoragateError as e:
        trial.structure_error = e.message
    if trial.structure is not None and policy.scan_weights:
        trial.weight_scan = scan_weights(weights_path, policy)
        timing["scan_s"] = trial.weight_scan.wall_time_s
    verdicts = run_checks(trial, Phase.STATIC)

    def report(outputs: dict[str, str] | None = None) -> ValidationReport:
        timing["total_s"] = time.perf_counter() - started
        return ValidationReport.assemble(
            version_id=target.version_id,
            name=target.name,
            base=BaseUnderTest(
                base_model_id=session.record.base_model_id,
                base_model_commit=session.record.base_model_commit,
                quantization_config=session.quantization_config,
            ),
            golden_set_digest=target.golden.digest,
            threshold=policy.pass_threshold,
            verdicts=verdicts,
            cases=trial.cases,
            outputs=outputs,
            output_sha256=canonical_sha256(outputs) if outputs is not None else None,
            drift=trial.drift,
            regression=trial.regression,
            scan=trial.weight_scan,
            timing=timing,
        )

    if trial.structure is None or (trial.weight_scan is not None and trial.weight_scan.action == "block"):
        return report()  # a blocked adapter is never loaded
    file_tensors = load_file(str(weights_path))
    t0 = time.perf_counter()
    try:
        trial.attachment = session.attach(bundle, trial.adapter_config, file_tensors)
    except Exception as e:  # PEFT raises plain ValueError/RuntimeError on adapters it refuses
        session.detach()
        trial.attach_error = f"{type(e).__name__}: {e}"
        verdicts += run_checks(trial, Phase.LOAD)
        return report()
    timing["load_s"] = time.perf_counter() - t0
    try:
        trial.loaded = session.loaded_state(file_tensors)
        load_verdicts = run_checks(trial, Phase.LOAD)
        verdicts += load_verdicts
        assert session.live is not None
        session.live.healthy = all(v.ok for v in load_verdicts)
        t0 = time.perf_counter()
        trial.base_run = session.base_run(target.golden)
        timing["base_forward_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        trial.run = session.generate(target.golden)
        timing["forward_s"] = time.perf_counter() - t0
        for case in target.golden.cases:
            completion = trial.run.texts[case.id]
            ok, why = match_case(case, completion)
            trial.cases.append(CaseResult(id=case.id, kind=case.kind, completion=completion, passed=ok, why=why))
            trial.base_passed += match_case(case, trial.base_run.texts[case.id])[0]
        t0 = time.perf_counter()
        _regression(session, trial)
        timing["regression_s"] = time.perf_counter() - t0
    except BaseException:
        session.detach()  # never leave a half-checked adapter in the live slot
        raise
    trial.drift = _drift(session, trial)
    verdicts += run_checks(trial, Phase.OUTPUTS)
    return report(trial.run.texts)


def base_failure_report(
    target: AdapterUnderTest,
    record: BaseModelRecord,
    quantization_config: Mapping[str, Any] | None,
    error: LoragateError,
    threshold: float,
) -> ValidationReport:
    """The report of an adapter whose base could not even be loaded (drift, gone)."""
    return ValidationReport.assemble(
        version_id=target.version_id,
        name=target.name,
        base=BaseUnderTest(
            base_model_id=record.base_model_id,
            base_model_commit=record.base_model_commit,
            quantization_config=dict(quantization_config) if quantization_config else None,
        ),
        golden_set_digest=target.golden.digest,
        threshold=threshold,
        verdicts=[CheckVerdict("base", False, error.message, {"code": error.code.value, "field": error.field})],
    )


def validate_group(
    record: BaseModelRecord,
    quantization_config: Mapping[str, Any] | None,
    targets: list[AdapterUnderTest],
    policy: ValidationPolicy,
    progress: Progress = quiet,
) -> list[ValidationReport]:
    """Validate adapters that share one base and quantization setup, loading it once."""
    try:
        session = BaseSession(record, quantization_config, policy.device, policy.hf_cache_dir)
    except LoragateError as e:
        return [base_failure_report(t, record, quantization_config, e, policy.pass_threshold) for t in targets]
    progress(f"loaded base {record.label} in {session.load_seconds:.2f}s" + (" (4-bit)" if quantization_config else ""))
    reports = []
    for target in targets:
        report = validate_adapter(session, target, policy)
        reports.append(report)
        progress(f"{target.version_id or target.name}: {report.status.value} - {report.summary}")
    return reports


def _group_key(manifest: Mapping[str, Any]) -> tuple[str, str, bytes]:
    return manifest["base_model_id"], manifest["base_model_commit"], canonical_json(manifest.get("quantization_config"))


def _baseline_for(registry: Registry, version: AdapterVersion, known: dict[str, Baseline], tmp: Path) -> Baseline:
    """What ``version`` is compared with: its adapter's production, materialized once per
    batch, or why there is nothing comparable."""
    production = registry.get_adapter(version.name).pointer(Pointer.PRODUCTION)
    if production is None:
        return Baseline(None, skipped=f"{version.name} has no production version yet")
    if production == version.version_id:
        return Baseline(production, skipped="this version is production")
    if production not in known:
        serving = registry.get_version(production)
        if _group_key(serving.manifest) != _group_key(version.manifest):
            known[production] = Baseline(
                production,
                skipped=f"production {production} is bound to another base or quantization "
                f"({serving.manifest['base_model_id']}@{serving.manifest['base_model_commit'][:12]}): "
                "not comparable on this version's base",
            )
        else:
            try:
                known[production] = Baseline(
                    production, bundle_dir=registry.materialize(production, tmp / f"production-{len(known):05d}")
                )
            except LoragateError as e:  # fail closed: no comparison is not a passed comparison
                known[production] = Baseline(production, error=f"production {production} unavailable: {e.message}")
    return known[production]


def validate_versions(
    registry: Registry, version_ids: Iterable[str], policy: ValidationPolicy, progress: Progress = quiet
) -> list[ValidationReport]:
    """Validate registered versions, grouped by base, and record every run.

    Bad input is refused before any model is loaded. Returns the reports, each carrying
    the id of the run it was recorded as, in the order the versions were given.

    Raises:
        NotFound: an unknown version, or an adapter with no golden set attached.
        IntegrityFailure: a stored blob or golden set is corrupted.
    """
    ids = list(dict.fromkeys(version_ids))
    versions = [registry.get_version(v) for v in ids]
    goldens = {v.name: registry.golden_set(v.name)[1] for v in versions}
    reports: dict[str, ValidationReport] = {}
    with scratch_dir("validate") as tmp:
        groups: dict[tuple[str, str, bytes], list[tuple[AdapterVersion, AdapterUnderTest]]] = {}
        baselines: dict[str, Baseline] = {}
        for i, v in enumerate(versions):
            run = registry.reference_run_for(v)
            target = AdapterUnderTest(
                name=v.name,
                bundle_dir=registry.materialize(v.version_id, tmp / f"{i:05d}"),
                manifest=v.manifest,
                golden=goldens[v.name],
                version_id=v.version_id,
                reference=reference_from_run(run, same_version=run is not None and run.version_id == v.version_id),
                production=_baseline_for(registry, v, baselines, tmp),
            )
            groups.setdefault(_group_key(v.manifest), []).append((v, target))
        for (base_id, commit, _), members in groups.items():
            record = registry.get_base(base_id, commit)
            started = utcnow()
            group_reports = validate_group(
                record, members[0][0].manifest.get("quantization_config"), [t for _, t in members], policy, progress
            )
            for (version, _), report in zip(members, group_reports, strict=True):
                run = registry.record_validation(version.version_id, report, started, utcnow())
                reports[version.version_id] = report.recorded_as(run.id)
    return [reports[v] for v in ids]


def validate_bundle(
    record: BaseModelRecord,
    bundle_dir: Path,
    golden: GoldenSet,
    policy: ValidationPolicy,
    name: str = "bundle",
    reference: Reference | None = None,
) -> ValidationReport:
    """Validate one bundle that is not (yet) registered: the same gate, no bookkeeping."""
    manifest = json.loads((Path(bundle_dir) / MANIFEST_FILE).read_text())
    target = AdapterUnderTest(
        name=name, bundle_dir=Path(bundle_dir), manifest=manifest, golden=golden, reference=reference
    )
    return validate_group(record, manifest.get("quantization_config"), [target], policy)[0]
