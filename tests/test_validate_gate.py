"""The validation gate wired to the registry: ``loragate validate``, batching, the lifecycle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit import corpus
from kit.tenant_tasks import write_golden_set
from loragate.registry.errors import NotFound
from tests.support.commands import main_with_tokens, role_tokens

pytestmark = pytest.mark.slow

SUPPORT = "acme/tiny-llama/support"
TICKETS = "globex/tiny-llama/tickets"


@pytest.fixture
def env(cataloged, monkeypatch, tmp_path):
    registry, _ = cataloged
    monkeypatch.setenv("LORAGATE_DATABASE_URL", registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", registry.settings.artifacts)
    monkeypatch.setenv("LORAGATE_ACTOR", "ci")
    TOKENS.clear()
    TOKENS.update(role_tokens(registry))
    return registry


TOKENS: dict[str, str] = {}


def run(capsys, *argv) -> tuple[int, dict | None, str]:
    rc = main_with_tokens(TOKENS, [*argv, "--json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else None), err


def attach(registry, name, task, tmp_path):
    registry.attach_golden_set(name, write_golden_set(task, tmp_path / f"{task}.jsonl"))


def test_validate_passes_good_adapters_and_rejects_broken_ones_in_one_batch(
    env, capsys, tmp_path, support_bundle, tickets_bundle
):
    registry = env
    good = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    tickets = registry.register_adapter(tickets_bundle, TICKETS).version.version_id
    # registers fine (bound, well-formed), but was trained for another task
    broken = registry.register_adapter(tickets_bundle, SUPPORT).version.version_id
    attach(registry, SUPPORT, "support", tmp_path)
    attach(registry, TICKETS, "tickets", tmp_path)

    rc, out, err = run(capsys, "validate", good, tickets, broken, "--progress")

    assert rc == 1
    statuses = {r["version_id"]: r["status"] for r in out["reports"]}
    assert statuses == {good: "passed", tickets: "passed", broken: "failed"}
    assert err.count("loaded base") == 1, "one base load for three adapters on the same base"
    assert registry.get_version(good).stage == "staging" and registry.get_version(good).validation_status == "passed"
    assert registry.get_version(broken).stage == "rejected"
    assert [f.split(":")[0] for f in next(r for r in out["reports"] if r["version_id"] == broken)["failures"]] == [
        "golden"
    ]


def test_what_register_cannot_see_validation_catches(env, capsys, tmp_path, support_bundle):
    """A well-formed QLoRA bundle declaring float16 compute registers, then fails on NaN."""
    registry = env
    bundle = corpus.large_activations(support_bundle, tmp_path / "fp16", "float16")
    vid = registry.register_adapter(bundle, SUPPORT).version.version_id
    attach(registry, SUPPORT, "support", tmp_path)
    rc, out, err = run(capsys, "validate", vid, "--progress")
    assert rc == 1 and "(4-bit)" in err
    assert {f.split(":")[0] for f in out["reports"][0]["failures"]} == {"finite", "golden"}
    assert registry.get_version(vid).stage == "rejected"


def test_a_passed_version_can_be_canaried_and_its_report_is_stored(env, capsys, tmp_path, support_bundle):
    registry = env
    vid = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    attach(registry, SUPPORT, "support", tmp_path)
    assert run(capsys, "validate", vid)[0] == 0
    rc, shown, _ = run(capsys, "show", vid)
    assert shown["manifest"]["validation_status"] == "passed"
    assert shown["manifest"]["validation_report"]["checks"]["golden"]["passed"] == 8
    assert shown["validation_runs"][0]["output_sha256"] == shown["manifest"]["validation_report"]["output_sha256"]
    assert run(capsys, "promote", vid, "--to", "canary")[0] == 0
    assert registry.resolve_stage(SUPPORT, "canary") == vid
    history = [e["action"] for e in run(capsys, "history", SUPPORT)[1]]
    assert history == ["register", "golden_set", "validate", "promote"]


def test_a_failed_version_never_reaches_canary(env, capsys, tmp_path, support_bundle):
    registry = env
    vid = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    attach(registry, SUPPORT, "tickets", tmp_path)  # the wrong task: golden fails for real
    assert run(capsys, "validate", vid)[0] == 1
    rc, out, err = run(capsys, "promote", vid, "--to", "canary")
    assert rc == 2 and out["error"]["code"] == "validation_required"
    assert registry.get_adapter(SUPPORT).canary is None


def test_second_version_reports_drift_against_the_first(
    env, capsys, tmp_path, support_bundle, retrained_support_bundle
):
    registry = env
    first = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    attach(registry, SUPPORT, "support", tmp_path)
    assert run(capsys, "validate", first)[0] == 0
    second = registry.register_adapter(retrained_support_bundle, SUPPORT).version.version_id
    rc, out, _ = run(capsys, "validate", second, "--threshold", "0.0")
    drift = out["reports"][0]["drift"]
    assert drift["reference_version"] == first and drift["same_version"] is False
    assert drift["mean_token_overlap_delta"] is not None


def test_revalidating_a_version_checks_it_reproduces(env, capsys, tmp_path, support_bundle):
    registry = env
    vid = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    attach(registry, SUPPORT, "support", tmp_path)
    assert run(capsys, "validate", vid)[0] == 0
    rc, out, _ = run(capsys, "validate", vid)
    report = out["reports"][0]
    assert rc == 0 and report["checks"]["reproducible"]["ok"] and report["drift"]["same_version"]
    assert len(registry.validation_runs(vid)) == 2


@pytest.mark.parametrize(
    "argv, code",
    [
        (["validate", "20990101_000000_000000000000"], "not_found"),
        (["validate", "{good}", "--threshold", "1.5"], "invalid_setting"),
        (["validate", "{good}"], "not_found"),  # no golden set attached yet
    ],
)
def test_validate_bad_input_exits_2_before_loading_anything(env, capsys, support_bundle, argv, code):
    registry = env
    good = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    rc, out, err = run(capsys, *[a.format(good=good) for a in argv])
    assert rc == 2 and out["error"]["code"] == code
    assert "loaded base" not in err
    assert registry.validation_runs(good) == []


def test_shadow_validate_task_runs_in_a_prefect_flow_with_only_ids_as_parameters(
    env, tmp_path, support_bundle, prefect_harness, worker_secrets
):
    from prefect import flow
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from loragate.registry.rules.access import Role
    from loragate.tasks.validation.prefect_tasks import shadow_validate

    registry = env
    vid = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    attach(registry, SUPPORT, "support", tmp_path)
    # the gate acts with the signing role's token from the gpu pool's secrets directory
    worker_secrets({Role.SIGNING: TOKENS["signing"]})

    @flow
    def validate_flow(ids: list[str]):
        return shadow_validate(ids)

    state = validate_flow([vid], return_state=True)
    reports = state.result()
    assert reports[0].status == "passed"
    assert registry.get_version(vid).validation_status == "passed"

    table = Artifact.get("shadow-validation")
    assert vid in str(table.data) and "8/8" in str(table.data)

    # Prefect stores and shows parameters: the run holds ids, never settings or the database URL
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    assert run.parameters == {"ids": [vid]}
    stored = run.model_dump_json() + "".join(t.model_dump_json() for t in task_runs)
    assert task_runs and registry.settings.database_url not in stored and "database_url" not in stored
    assert TOKENS["signing"] not in stored
    assert registry.history(SUPPORT)[-1].actor.startswith("signing-tests (signing token ")


def test_a_bad_golden_set_exits_2_and_attaches_nothing(env, capsys, tmp_path, random_bundle):
    registry = env
    registry.register_adapter(random_bundle, SUPPORT)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "p", "equals": "x"}\n{"id": "a", "prompt": "q", "startswith": "y"}\n')
    blobs = Path(registry.settings.artifacts) / "blobs"
    blobs_before = sorted(p.name for p in blobs.rglob("*"))
    rc, out, err = run(capsys, "golden", "set", SUPPORT, str(bad))
    assert rc == 2 and out["error"]["code"] == "invalid_golden_set"
    assert "expect_column_values_to_be_unique(id)" in err and "expect_column_values_to_be_in_set(kind)" in err
    with pytest.raises(NotFound):
        registry.golden_set(SUPPORT)
    assert sorted(p.name for p in blobs.rglob("*")) == blobs_before


def test_a_backtracking_regex_in_a_golden_set_cannot_hang_validation(env, capsys, tmp_path, support_bundle):
    """``^([\\s\\S]+)+Z$`` takes exponential time in a backtracking engine on any completion
    without a Z; the gate matches it with RE2, so validate finishes and reports the case."""
    import time

    from kit.tenant_tasks import golden_cases

    registry = env
    vid = registry.register_adapter(support_bundle, SUPPORT).version.version_id
    cases = golden_cases("support")
    cases[0] = {"id": "catastrophic", "prompt": cases[0]["prompt"], "regex": r"^([\s\S]+)+Z$"}
    path = tmp_path / "golden.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    registry.attach_golden_set(SUPPORT, path)
    started = time.monotonic()
    rc, out, _ = run(capsys, "validate", vid, "--threshold", "0.5")
    assert time.monotonic() - started < 120 and rc == 0
    case = next(c for c in out["reports"][0]["cases"] if c["id"] == "catastrophic")
    assert case["passed"] is False and "expected to match" in case["why"]
