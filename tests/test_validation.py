"""Shadow validation on real forward passes: the silent-failure corpus and the gate.

Every corpus case is a real bundle broken one way (infra/corpus.py); each must fail
with a diagnostic that names its cause, while the trained adapters pass, on the float32
base and on the 4-bit NF4 base.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from kit import corpus
from kit.modelkit import NF4, random_adapter
from kit.tenant_tasks import golden_set
from loragate.registry.intake.catalog import inspect_base
from loragate.registry.settings import Settings
from loragate.tasks.validation import Reference, ValidationPolicy, validate_bundle

pytestmark = pytest.mark.slow

POLICY = ValidationPolicy.from_settings(Settings())


@pytest.fixture(scope="module")
def base_record(tiny_base):
    return inspect_base(str(tiny_base), "tiny-llama")


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("corpus")


def failed_checks(report) -> set[str]:
    return {f.split(":", 1)[0] for f in report.failures}


# -- good adapters pass --------------------------------------------------------------


@pytest.mark.parametrize(
    "task, quantization",
    [("support", None), ("tickets", None), ("support", NF4)],
    ids=["support", "tickets", "support-nf4"],
)
def test_trained_adapters_pass_every_check(base_record, support_bundle, tickets_bundle, corpus_dir, task, quantization):
    bundle = {"support": support_bundle, "tickets": tickets_bundle}[task]
    if quantization:
        bundle = corpus.bound_to(bundle, corpus_dir / f"{task}-nf4", quantization_config=quantization)
    report = validate_bundle(base_record, bundle, golden_set(task), POLICY)
    assert report.status == "passed", report.failures
    assert report.checks["golden"]["pass_rate"] >= 0.8
    assert report.checks["golden"]["base_pass_rate"] == 0.0  # the set discriminates
    assert report.checks["noop"]["max_abs_logit_delta"] > 1.0
    assert report.checks["load"]["lora_params_loaded"] == report.checks["weights"]["lora_params_in_file"]
    assert report.base.quantization_config == quantization
    assert len(report.output_sha256) == 64


def test_an_adapter_on_the_wrong_task_fails_the_golden_set(base_record, support_bundle):
    report = validate_bundle(base_record, support_bundle, golden_set("tickets"), POLICY)
    assert failed_checks(report) == {"golden"}
    assert report.checks["golden"]["passed"] == 0


def test_validation_is_deterministic(base_record, support_bundle):
    a = validate_bundle(base_record, support_bundle, golden_set("support"), POLICY)
    b = validate_bundle(base_record, support_bundle, golden_set("support"), POLICY)
    assert a.output_sha256 == b.output_sha256


# -- the corpus: one case per silent failure -----------------------------------------


CORPUS = [
    # (case, builder, expected failing checks, words the diagnostic must contain)
    ("target-module-missing-entirely", corpus.missing_target, {"load"}, "PEFT refused"),
    ("targets-match-only-part", corpus.partial_targets, {"load"}, "meta device"),
    ("config-lists-fewer-modules-than-file", corpus.fewer_targets_in_config, {"load"}, "dropped"),
    ("renamed-layer-prefix", corpus.renamed_layer_prefix, {"load", "golden"}, "renamed or stripped key prefix"),
    ("nan-in-q-proj", corpus.nan_in_q_proj, {"weights", "finite", "golden"}, "NaN"),
    ("all-lora-b-zero", corpus.zero_lora_b, {"weights", "noop", "golden"}, "all zero"),
    ("lora-alpha-zero", corpus.zero_alpha, {"noop", "golden"}, "no effect"),
    (
        "bnb-float16-compute-nan",
        lambda s, d: corpus.large_activations(s, d, "float16"),
        {"finite", "golden"},
        "compute dtype float16",
    ),
    (
        "bound-to-another-base",
        lambda s, d: corpus.bound_to(s, d, base_model_id="llama-3-8b"),
        {"binding"},
        "base_model_id",
    ),
]


@pytest.mark.parametrize("case, build, expected, words", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_case_fails_with_a_diagnostic_naming_its_cause(
    base_record, support_bundle, corpus_dir, case, build, expected, words
):
    bundle = build(support_bundle, corpus_dir / case)
    report = validate_bundle(base_record, bundle, golden_set("support"), POLICY)
    assert report.status == "failed"
    assert expected <= failed_checks(report), report.failures
    assert words in " ".join(report.failures)


def test_same_large_activations_in_bfloat16_stay_finite(base_record, support_bundle, corpus_dir):
    """The float16 case fails for its dtype, not for the weights: bfloat16 is finite."""
    bundle = corpus.large_activations(support_bundle, corpus_dir / "bf16", "bfloat16")
    report = validate_bundle(base_record, bundle, golden_set("support"), POLICY)
    assert report.checks["finite"]["ok"] and report.checks["load"]["ok"], report.failures


@pytest.mark.parametrize("compute_dtype", ["float16", "bfloat16"])
def test_weights_rounded_through_the_compute_dtype_still_count_as_loaded(
    base_record, support_bundle, corpus_dir, compute_dtype
):
    quantization = {**NF4, "bnb_4bit_compute_dtype": compute_dtype}
    bundle = corpus.bound_to(support_bundle, corpus_dir / f"nf4-{compute_dtype}", quantization_config=quantization)
    report = validate_bundle(base_record, bundle, golden_set("support"), POLICY)
    assert report.checks["load"]["ok"], report.failures


def test_rank_above_the_fleet_limit_fails(base_record, tiny_base, corpus_dir):
    bundle = random_adapter(tiny_base, corpus_dir / "rank32", rank=32, alpha=32)
    report = validate_bundle(base_record, bundle, golden_set("support"), replace(POLICY, max_lora_rank=16))
    assert "rank" in failed_checks(report)
    assert "above the fleet's max_lora_rank 16" in " ".join(report.failures)


def test_base_with_fewer_layers_drops_weights(support_bundle, tmp_path):
    from kit.basekit import build_base

    shallow = inspect_base(str(build_base(tmp_path / "one-layer", num_layers=1)), "tiny-llama")
    report = validate_bundle(shallow, support_bundle, golden_set("support"), POLICY)
    assert "load" in failed_checks(report)
    assert "base has fewer layers" in " ".join(report.failures)


def test_base_with_other_rope_is_a_binding_failure(base_record, support_bundle, tmp_path, corpus_dir):
    from kit.basekit import build_base

    bound = corpus.bound_to(
        support_bundle,
        corpus_dir / "bound-default",
        base_model_commit=base_record.base_model_commit,
        base_config_sha256=base_record.config_sha256,
        rope_scaling=None,
    )
    variant = inspect_base(
        str(build_base(tmp_path / "rope", rope_scaling={"rope_type": "linear", "factor": 2.0})), "tiny-llama"
    )
    report = validate_bundle(variant, bound, golden_set("support"), POLICY)
    assert failed_checks(report) >= {"binding"}
    assert "rope drift" in " ".join(report.failures)


@pytest.mark.parametrize(
    "tamper, words",
    [(corpus.tamper_rope_in_place, "config drift"), (corpus.tamper_weights_in_place, "content drift")],
    ids=["rope-changed-in-place", "base-weights-silently-updated"],
)
def test_silent_base_updates_fail_validation_naming_the_drift(tiny_base, support_bundle, tmp_path, tamper, words):
    copy = tmp_path / "base"
    shutil.copytree(tiny_base, copy)
    record = inspect_base(str(copy), "tiny-llama")
    tamper(copy)
    report = validate_bundle(record, support_bundle, golden_set("support"), POLICY)
    assert failed_checks(report) == {"base"}
    assert report.checks["base"]["code"] == "base_drift"
    assert words in report.failures[0]


def test_changed_outputs_of_the_same_version_are_runtime_drift(base_record, support_bundle):
    gs = golden_set("support")
    first = validate_bundle(base_record, support_bundle, gs, POLICY)
    earlier = dict(first.outputs)
    earlier["support-0"] = "ACME-OK: something the old runtime said"
    ref = Reference(
        version_id="v-same", outputs=earlier, output_sha256=None, golden_set_digest=gs.digest, same_version=True
    )
    report = validate_bundle(base_record, support_bundle, gs, POLICY, reference=ref)
    assert failed_checks(report) == {"reproducible"}
    assert report.drift.changed_cases == ["support-0"]
    assert report.drift.mean_token_overlap_delta > 0


def test_drift_against_another_version_is_reported_not_failed(base_record, support_bundle):
    gs = golden_set("support")
    first = validate_bundle(base_record, support_bundle, gs, POLICY)
    ref = Reference(
        version_id="v-previous",
        outputs=first.outputs,
        output_sha256=first.output_sha256,
        golden_set_digest=gs.digest,
        same_version=False,
    )
    report = validate_bundle(base_record, support_bundle, gs, POLICY, reference=ref)
    assert report.status == "passed"
    assert report.drift.mean_token_overlap_delta == 0.0 and report.drift.changed_cases == []


def test_batched_hotswaps_agree_with_fresh_loads_and_never_mask_silent_failures(
    base_record, support_bundle, tickets_bundle, corpus_dir
):
    from loragate.tasks.validation import AdapterUnderTest, validate_group

    gs = golden_set("support")
    rescaled = corpus.with_alpha(support_bundle, corpus_dir / "batch-alpha", 12)  # same tensors, other scaling
    bundles = [
        support_bundle,
        tickets_bundle,  # same layers: hot-swapped
        rescaled,  # hot-swapped, and its scaling must follow
        corpus.fewer_targets_in_config(support_bundle, corpus_dir / "batch-fewer"),  # same tensors, other config
        support_bundle,
        corpus.partial_targets(support_bundle, corpus_dir / "batch-partial"),
        support_bundle,
    ]
    targets = [
        AdapterUnderTest(name=f"n{i}", bundle_dir=b, manifest=json.loads((b / "manifest.json").read_text()), golden=gs)
        for i, b in enumerate(bundles)
    ]
    batched = validate_group(base_record, None, targets, POLICY)
    fresh = [validate_group(base_record, None, [t], POLICY)[0] for t in targets]

    for b, f in zip(batched, fresh, strict=False):
        assert b.status == f.status
        assert ("load" in failed_checks(b)) == ("load" in failed_checks(f))
        if f.checks["load"]["ok"]:
            # what LoRA left on meta computes is undefined; everything that loads agrees exactly
            assert (b.output_sha256, failed_checks(b)) == (f.output_sha256, failed_checks(f))
    assert [r.checks["load"]["mode"] for r in batched] == [
        "fresh",
        "hotswap",
        "hotswap",
        "fresh",
        "fresh",
        "fresh",
        "fresh",
    ]
    assert [r.status for r in batched][:2] + [r.status for r in batched][3:] == [
        "passed",
        "failed",
        "failed",
        "passed",
        "failed",
        "passed",
    ]
    delta = lambda r: r.checks["noop"]["max_abs_logit_delta"]  # noqa: E731
    assert delta(batched[2]) != pytest.approx(delta(batched[0]))  # the new scaling took effect...
    assert delta(batched[2]) == pytest.approx(delta(fresh[2]), rel=1e-5)  # ...exactly as a fresh load's
