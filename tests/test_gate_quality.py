"""Gate quality beyond a pass rate: slice regression against production, and the weight scan.

A candidate is run on its golden set next to the version in production, in the same base
session; a slice it breaks rejects it, and the report names the slice, its cases and
what their prompts share. adaptersentry scans the weights before anything loads: a
planted outlier is flagged, ``block`` rejects, ``review`` reaches production only when
the approval says so.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from infra import corpus, modelkit
from registry.errors import ErrorCode, IllegalTransition, InvalidInput
from registry.intake.golden import parse_golden_set
from registry.rules.canary import WindowStatus
from registry.service import Registry
from tasks.validation.policy import ValidationPolicy
from tasks.validation.regression import common_ngrams, compare_with_production
from tasks.validation.scan import scan_weights
from tests.support.commands import main_with_tokens, role_tokens
from tests.support.prefect_env import client_env, prefect_server_fixture, wait_for_state  # noqa: F401  (a fixture)
from tests.support.registries import open_sqlite_registry, sign

ORDERS = "initech/tiny-llama/orders"
SUPPORT = "acme/deep-llama/support"


def _golden_bytes(cases: list[dict]) -> bytes:
    return "".join(json.dumps(c) + "\n" for c in cases).encode()


# -- golden slices ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_slice",
    [
        pytest.param("refund", id="a string"),
        pytest.param(["intent", "refund"], id="a list"),
        pytest.param({}, id="empty"),
        pytest.param({"Intent": "refund"}, id="upper-case key"),
        pytest.param({"intent": 3}, id="a number as value"),
        pytest.param({"intent": ""}, id="empty value"),
        pytest.param({"intent": "a=b"}, id="'=' in a value"),
        pytest.param({"intent": "x" * 65}, id="value over 64 characters"),
        pytest.param({f"k{i}": "v" for i in range(9)}, id="nine keys"),
    ],
)
def test_a_slice_of_the_wrong_shape_fails_the_golden_set_expectations(bad_slice):
    cases = modelkit.golden_cases("orders")
    cases[4]["slice"] = bad_slice
    with pytest.raises(InvalidInput) as refused:
        parse_golden_set(_golden_bytes(cases), min_cases=5)
    assert refused.value.code == ErrorCode.INVALID_GOLDEN_SET and refused.value.field == "golden_set"
    assert "expect_column_values_to_match_json_schema(slice): 1 bad" in refused.value.message


def test_slices_are_optional_and_name_each_key_and_their_combination():
    cases = modelkit.golden_cases("orders")
    del cases[0]["slice"]
    golden = parse_golden_set(_golden_bytes(cases), min_cases=5)
    assert golden.cases[0].slice_labels == []
    assert golden.cases[1].slice_labels == ["intent=refund", "lang=en", "intent=refund,lang=en"]
    # the slice is part of the set's identity: relabelling a case is a new set
    assert golden.digest != modelkit.golden_set("orders").digest


# -- the comparison, on recorded outcomes -----------------------------------------------


def test_common_ngrams_name_what_the_failing_prompts_share_and_not_the_template():
    failing = [
        "### initech orders: refund my order 7\n### reply:",
        "### initech orders: refund my order 30\n### reply:",
    ]
    others = [
        "### initech orders: refund my order 12\n### reply:",
        "### initech orders: where is my parcel 7\n### reply:",
        "### initech orders: wo ist mein paket 30\n### reply:",
    ]
    grams = common_ngrams(failing, others)
    assert grams[0].text == "refund my order" and (grams[0].failing, grams[0].others) == (2, 1)
    # "refund", "my order", ... inside it with the same counts add nothing
    assert not {"refund", "my order", "refund my"} & {g.text for g in grams}
    assert not {"initech", "orders", "reply"} & {g.text for g in grams}, "every prompt has the template"


ALL = {f"orders-{i}": True for i in range(9)}


@pytest.mark.parametrize(
    "candidate_fails, production_fails, epsilon, regressed",
    [
        pytest.param(set(), set(), 0.0, [], id="identical"),
        pytest.param({"orders-3"}, {"orders-3"}, 0.0, [], id="same failures"),
        pytest.param(set(), {"orders-1", "orders-5"}, 0.0, [], id="strictly better"),
        pytest.param(
            {"orders-1", "orders-2"},
            {"orders-3", "orders-4", "orders-5"},
            0.0,
            ["intent=refund", "intent=refund,lang=en"],
            id="better overall, worse on refunds",
        ),
        pytest.param(
            {"orders-1"}, set(), 0.0, ["overall", "intent=refund", "lang=en", "intent=refund,lang=en"], id="one case"
        ),
        pytest.param({"orders-1"}, set(), 0.34, [], id="one case of three within epsilon 0.34"),
        pytest.param({"orders-7"}, set(), 0.2, ["intent=track,lang=de", "lang=de"], id="a combination"),
    ],
)
def test_a_slice_regresses_when_its_pass_rate_drops_by_more_than_epsilon(
    candidate_fails, production_fails, epsilon, regressed
):
    golden = modelkit.golden_set("orders")
    result = compare_with_production(
        golden.cases,
        {cid: cid not in candidate_fails for cid in ALL},
        {cid: cid not in production_fails for cid in ALL},
        production_version="v-prod",
        epsilon=epsilon,
    )
    assert sorted(c.slice for c in result.regressed) == sorted(regressed)
    for change in result.regressed:
        assert change.failing_cases and set(change.failing_cases) <= candidate_fails - production_fails


# -- on real adapters -------------------------------------------------------------------


@pytest.fixture
def sqlite_registry(tmp_path) -> Registry:
    """A registry for the model-loading tests (the store is tested on both databases
    elsewhere; these are about the gate)."""
    reg = open_sqlite_registry(tmp_path)
    yield reg
    reg.close()


def _queries(**slice_filter: str) -> list[str]:
    return [
        e.query
        for e in modelkit.TASKS["orders"]["examples"]
        if e.slice and all(e.slice[k] == v for k, v in slice_filter.items())
    ]


@pytest.fixture(scope="session")
def orders_bundles(kit, tiny_base) -> dict[str, Path]:
    """Production knows refunds and German tracking (6/9); the candidate knows all tracking
    and one refund (7/9): better overall, worse on refunds. The twin is production's
    weights under another version."""
    production = modelkit.train_adapter(
        tiny_base, "orders", kit / "orders-production", queries=_queries(intent="refund") + _queries(lang="de")
    )
    candidate = modelkit.train_adapter(
        tiny_base, "orders", kit / "orders-candidate", queries=_queries(intent="refund")[:1] + _queries(intent="track")
    )
    twin = corpus.bound_to(production, kit / "orders-twin", training_git_commit="f" * 40)
    return {"production": production, "candidate": candidate, "twin": twin}


def _cli(registry: Registry, monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("LORAGATE_DATABASE_URL", registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", registry.settings.artifacts)
    rc = main_with_tokens(role_tokens(registry), list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _register(registry: Registry, bundle: Path, name: str, task: str, tmp_path: Path) -> str:
    vid = registry.register_adapter(bundle, name).version.version_id
    registry.attach_golden_set(name, modelkit.write_golden_set(task, tmp_path / f"{task}.jsonl"))
    return vid


def _in_production(registry: Registry, vid: str, monkeypatch, capsys) -> str:
    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", vid, "--threshold", "0.5", "--json")
    assert rc == 0, out
    sign(registry, vid)
    registry.promote(vid, "canary")
    registry.promote(vid, "production")
    return vid


@pytest.fixture
def orders_in_production(sqlite_registry, tiny_base, orders_bundles, tmp_path, monkeypatch, capsys):
    registry = sqlite_registry
    registry.add_base(str(tiny_base), "tiny-llama")
    vid = _register(registry, orders_bundles["production"], ORDERS, "orders", tmp_path)
    return registry, _in_production(registry, vid, monkeypatch, capsys)


@pytest.mark.slow
def test_the_first_version_has_no_production_to_compare_with_and_the_check_says_so(
    orders_in_production, monkeypatch, capsys
):
    registry, production = orders_in_production
    report = registry.validation_runs(production)[-1].report
    assert report.checks["regression"].ok
    assert report.checks["regression"]["skipped"] == f"{ORDERS} has no production version yet"
    assert report.regression is not None and report.regression.overall is None


@pytest.mark.slow
def test_a_candidate_better_overall_but_worse_on_a_slice_is_rejected_naming_the_slice_its_cases_and_a_common_ngram(
    orders_in_production, orders_bundles, monkeypatch, capsys
):
    registry, production = orders_in_production
    candidate = registry.register_adapter(orders_bundles["candidate"], ORDERS).version.version_id

    rc, out, err = _cli(
        registry, monkeypatch, capsys, "validate", candidate, "--threshold", "0.5", "--json", "--progress"
    )

    assert rc == 1
    assert err.count("loaded base") == 1, "production runs in the candidate's base session"
    report = json.loads(out)["reports"][0]
    assert report["checks"]["golden"]["ok"] and report["checks"]["golden"]["passed"] == 7, "better overall: 7/9"
    assert [f.split(":")[0] for f in report["failures"]] == ["regression"]
    regression = report["regression"]
    assert regression["production_version"] == production and regression["epsilon"] == 0.0
    assert regression["overall"]["before"] == pytest.approx(6 / 9) and regression["overall"]["after"] == pytest.approx(
        7 / 9
    )
    assert not regression["overall"]["regressed"]
    refund = next(s for s in regression["slices"] if s["slice"] == "intent=refund")
    assert refund["regressed"] and (refund["before"], refund["after"]) == (1.0, pytest.approx(1 / 3))
    assert refund["failing_cases"] == ["orders-1", "orders-2"]
    assert refund["common_ngrams"][0]["text"] == "refund my order"
    assert [s["slice"] for s in regression["slices"] if s["regressed"]] == ["intent=refund", "intent=refund,lang=en"]
    assert 'intent=refund 3/3 -> 1/3 (orders-1, orders-2; "refund my order"' in report["failures"][0]
    assert registry.get_version(candidate).stage == "rejected"
    assert registry.get_adapter(ORDERS).production == production

    # the compact table says the same without --json
    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", candidate, "--threshold", "0.5")
    header, row = out.splitlines()[:2]
    assert header.split() == ["VERSION", "ADAPTER", "STATUS", "GOLDEN", "REGRESSION", "SCAN"]
    assert row.split() == [candidate, ORDERS, "failed", "7/9", "2", "regressed", "allow"]
    assert "intent=refund 3/3 -> 1/3" in out


@pytest.mark.slow
def test_the_prefect_validation_artifacts_show_the_regressed_slice(
    orders_in_production, orders_bundles, prefect_harness, monkeypatch, worker_secrets
):
    from prefect import flow
    from prefect.artifacts import Artifact

    from registry.rules.access import Role
    from tasks.validation.prefect_tasks import shadow_validate

    registry, production = orders_in_production
    candidate = registry.register_adapter(orders_bundles["candidate"], ORDERS).version.version_id
    worker_secrets({Role.SIGNING: role_tokens(registry)["signing"]})
    monkeypatch.setenv("LORAGATE_VALIDATION_THRESHOLD", "0.5")  # the worker's settings: 7/9 clears it

    @flow
    def validate_flow(ids: list[str]):
        return shadow_validate(ids)

    validate_flow([candidate])

    row = next(r for r in json.loads(Artifact.get("shadow-validation").data) if r["version"] == candidate)
    assert row["status"] == "failed" and row["scan"] == "allow"
    assert row["regression"].startswith(f"vs {production}: intent=refund 3/3 -> 1/3 (orders-1, orders-2")
    evidence = Artifact.get("validation-initech-tiny-llama-orders").data
    assert f"Production `{production}`, epsilon 0." in evidence
    assert "| intent=refund | 3 | 1.00 | 0.33 | **yes** | orders-1, orders-2 | refund my order (2/2) |" in evidence
    assert "| overall | 9 | 0.67 | 0.78 | no | orders-1, orders-2 |" in evidence
    assert "#### Weight scan: **allow** (adaptersentry 2.0.2, policy strict)" in evidence


@pytest.mark.slow
def test_a_candidate_identical_in_behaviour_to_production_passes_the_regression_check(
    orders_in_production, orders_bundles, monkeypatch, capsys
):
    registry, production = orders_in_production
    twin = registry.register_adapter(orders_bundles["twin"], ORDERS).version.version_id
    assert twin != production

    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", twin, "--threshold", "0.5", "--json")

    assert rc == 0, out
    regression = json.loads(out)["reports"][0]["regression"]
    assert regression["production_version"] == production and regression["skipped"] is None
    assert regression["overall"]["before"] == regression["overall"]["after"] == pytest.approx(6 / 9)
    assert not any(s["regressed"] for s in regression["slices"]) and len(regression["slices"]) == 7


# -- the weight scan ----------------------------------------------------------------------

SCAN_POLICY = ValidationPolicy(
    pass_threshold=0.5, max_lora_rank=16, noop_tolerance=1e-4, device="cpu", hf_cache_dir=None
)


@pytest.fixture(scope="session")
def deep_base(kit) -> Path:
    """16 layers: enough modules per family for adaptersentry to compare within the adapter."""
    return modelkit.build_base(kit / "deep-llama", num_layers=16)


@pytest.fixture(scope="session")
def deep_adapters(kit, deep_base) -> dict[str, Path]:
    normal = modelkit.random_adapter(
        deep_base, kit / "deep-normal", targets=modelkit.DEFAULT_TARGETS, base_model_id="deep-llama"
    )
    trained = modelkit.train_adapter(deep_base, "support", kit / "deep-support", steps=150, base_model_id="deep-llama")
    return {
        "normal": normal,
        "planted": corpus.planted_outlier(normal, kit / "deep-planted", layer=8, module="down_proj"),
        "trained": trained,
        "trained-planted": corpus.planted_outlier(trained, kit / "deep-support-planted", layer=8, module="o_proj"),
    }


@pytest.mark.slow
def test_the_scan_flags_a_planted_outlier_and_allows_a_normal_adapter(deep_adapters, random_bundle):
    normal = scan_weights(deep_adapters["normal"] / corpus.WEIGHTS, SCAN_POLICY)
    planted = scan_weights(deep_adapters["planted"] / corpus.WEIGHTS, SCAN_POLICY)

    assert normal.action == "allow" and normal.max_concentration_z is not None and normal.max_concentration_z < 14
    assert planted.action == "review"
    outlier = next(r for r in planted.reasons if r.code == "INTRA_OUTLIER")
    assert "down_proj layer 8" in outlier.message
    assert planted.scanner == "adaptersentry 2.0.2" and planted.policy == "strict"

    # on the model kit's 2-layer base there is nothing to compare within: it says so
    shallow = scan_weights(random_bundle / corpus.WEIGHTS, SCAN_POLICY)
    assert shallow.action == "allow" and shallow.max_concentration_z is None
    assert "too few modules per family for intra-adapter comparison" in shallow.limits


@pytest.fixture
def deep_registry(sqlite_registry, deep_base):
    sqlite_registry.add_base(str(deep_base), "deep-llama")
    return sqlite_registry


@pytest.mark.slow
def test_a_block_verdict_rejects_the_adapter_before_it_loads(
    deep_registry, deep_adapters, monkeypatch, capsys, tmp_path
):
    registry = deep_registry
    vid = _register(registry, deep_adapters["planted"], SUPPORT, "support", tmp_path)
    monkeypatch.setenv("LORAGATE_SCAN_BLOCK_Z", "30")

    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", vid, "--json")

    assert rc == 1
    report = json.loads(out)["reports"][0]
    assert report["scan"]["action"] == "block"
    assert {r["code"] for r in report["scan"]["reasons"]} >= {"INTRA_OUTLIER", "LORAGATE_SCAN_BLOCK_Z"}
    assert [f.split(":")[0] for f in report["failures"]] == ["scan"]
    assert "adaptersentry 2.0.2 blocks the adapter" in report["failures"][0]
    assert "load" not in report["checks"] and "load_s" not in report["timing"], "a blocked adapter never loads"
    assert registry.get_version(vid).stage == "rejected"


@pytest.mark.slow
def test_a_review_verdict_reaches_production_only_with_an_acknowledgement(
    deep_registry, deep_adapters, monkeypatch, capsys, tmp_path
):
    registry = deep_registry
    vid = _register(registry, deep_adapters["trained-planted"], SUPPORT, "support", tmp_path)
    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", vid, "--threshold", "0.5", "--json")
    report = json.loads(out)["reports"][0]
    assert rc == 0 and report["status"] == "passed", report["failures"]
    assert report["scan"]["action"] == "review" and report["checks"]["scan"]["ok"]
    assert "weight scan: review" in report["summary"]
    sign(registry, vid)
    registry.promote(vid, "canary")  # the canary needs no acknowledgement: it is the next look

    # the sign-off from a shell is refused before anything resumes
    window, _ = registry.open_canary_window(vid)
    registry.close_canary_window(window.id, WindowStatus.READY, "in band")
    registry.request_approval(window.id, str(uuid.uuid4()))
    registry.create_token("activation", "alice")
    rc, _, err = _cli(registry, monkeypatch, capsys, "approve", vid)
    assert rc == 2 and err.count("\n") == 1
    assert "under weight-scan review" in err and "--acknowledge-scan-review" in err

    with pytest.raises(IllegalTransition) as refused:
        registry.promote(vid, "production")
    assert refused.value.code == ErrorCode.SCAN_REVIEW_UNACKNOWLEDGED
    assert refused.value.field == "acknowledge_scan_review"
    rc, _, err = _cli(registry, monkeypatch, capsys, "promote", vid, "--to", "production")
    assert rc == 2 and "under weight-scan review" in err
    assert registry.get_adapter(SUPPORT).production is None, "nothing moved"

    rc, out, err = _cli(
        registry, monkeypatch, capsys, "promote", vid, "--to", "production", "--acknowledge-scan-review"
    )
    assert rc == 0, err
    assert registry.get_adapter(SUPPORT).production == vid
    moved = [e for e in registry.history(SUPPORT) if e.stage == "production" and e.to_value == vid][-1]
    assert "weight-scan review acknowledged" in (moved.reason or "")


@pytest.mark.slow
def test_the_promote_flow_asks_again_when_an_approval_does_not_acknowledge_a_scan_review(
    deep_registry, deep_adapters, prefect_server, monkeypatch, capsys, tmp_path, worker_secrets
):
    from prefect.artifacts import Artifact
    from prefect.flow_runs import resume_flow_run
    from prefect.input.actions import filter_flow_run_input

    from flows.promote import promote_flow
    from registry.rules.access import Role

    registry = deep_registry
    vid = _register(registry, deep_adapters["trained-planted"], SUPPORT, "support", tmp_path)
    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", vid, "--threshold", "0.5", "--json")
    assert rc == 0 and json.loads(out)["reports"][0]["scan"]["action"] == "review"
    sign(registry, vid)
    registry.promote(vid, "canary")
    window, _ = registry.open_canary_window(vid)
    registry.close_canary_window(window.id, WindowStatus.READY, "in band")
    _, alice = registry.create_token("activation", "alice")
    worker_secrets({Role.ACTIVATION: role_tokens(registry)["activation"]})

    outcome: dict = {}

    def run_flow() -> None:
        try:
            with client_env(prefect_server):
                outcome["result"] = promote_flow(vid)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=run_flow, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while (run_id := registry.latest_canary_window(vid).approval_flow_run_id) is None:
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.5)
    wait_for_state(prefect_server, run_id, "PAUSED")
    with client_env(prefect_server):
        evidence = Artifact.get("approval-acme-deep-llama-support").data
    assert "#### Weight scan: **review**" in evidence and "INTRA_OUTLIER" in evidence

    # alice's real code, but the acknowledgement not ticked: refused, and the code spent
    with Registry.open(registry.settings.model_copy(update={"token": alice})) as as_alice:
        first_code = as_alice.issue_approval_code(vid)[1]
    decision = {
        "approve": True,
        "reviewer": "alice",
        "comment": "looks fine",
        "acknowledge_scan_review": False,
        "code": first_code,
    }
    with client_env(prefect_server):
        resume_flow_run(uuid.UUID(run_id), run_input=decision)
    wait_for_state(prefect_server, run_id, "PAUSED")  # asked again
    with client_env(prefect_server):
        refused = Artifact.get("approval-acme-deep-llama-support")
    assert refused.description.startswith("approval by alice refused:") and "weight-scan review" in refused.description
    assert registry.get_adapter(SUPPORT).production is None, "nothing moved"

    # whoever holds the Prefect credential reads every input the run stored, ticks the
    # acknowledgement alice never gave and resumes with her code: it is spent
    with client_env(prefect_server):
        stored = [
            i
            for i in filter_flow_run_input("", limit=200, flow_run_id=uuid.UUID(run_id))
            if i.key.endswith("-response")
        ]
        assert stored and any(i.decoded_value.get("code") == first_code for i in stored)
        for replayed in stored:
            resume_flow_run(uuid.UUID(run_id), run_input={**replayed.decoded_value, "acknowledge_scan_review": True})
            wait_for_state(prefect_server, run_id, "PAUSED")
        refused = Artifact.get("approval-refused-acme-deep-llama-support")
    assert refused.description.startswith("sign-off as alice refused (approval_code_used)")
    assert registry.get_adapter(SUPPORT).production is None, "nothing moved"

    # acknowledged, but with a forged approval code: refused as an artifact, asked again
    forged = {**decision, "acknowledge_scan_review": True, "code": "lac_" + "0" * 12 + "_" + "A" * 22}
    with client_env(prefect_server):
        resume_flow_run(uuid.UUID(run_id), run_input=forged)
    wait_for_state(prefect_server, run_id, "PAUSED")
    with client_env(prefect_server):
        refused = Artifact.get("approval-refused-acme-deep-llama-support")
    assert refused.description.startswith("sign-off as alice refused (approval_code_invalid)")
    assert registry.get_adapter(SUPPORT).production is None, "nothing moved"

    with Registry.open(registry.settings.model_copy(update={"token": alice})) as as_alice:
        record, code = as_alice.issue_approval_code(vid)
    with client_env(prefect_server):
        resume_flow_run(uuid.UUID(run_id), run_input={**forged, "code": code})
    thread.join(120)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"]["decision"] == "approved"
    assert registry.get_adapter(SUPPORT).production == vid
    moved = [e for e in registry.history(SUPPORT) if e.stage == "production" and e.to_value == vid][-1]
    assert moved.reason == "approved by alice: looks fine; weight-scan review acknowledged"
    (approval,) = [e for e in registry.history(SUPPORT) if e.action == "approval"]
    assert approval.details["token_id"] == record.token_id and approval.details["approval_code"] == record.code_id
