"""Gate quality beyond a pass rate: slice regression against production.

A candidate is run on its golden set next to the version in production, in the same base
session; a slice it breaks rejects it, and the report names the slice, its cases and
what their prompts share. The weight scan, the other check beyond the pass rate, is
``test_weight_scan.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit import corpus, modelkit, tenant_tasks
from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.intake.golden import parse_golden_set
from loragate.registry.service import Registry
from loragate.tasks.validation.regression import common_ngrams, compare_with_production
from tests.support.commands import main_with_tokens, role_tokens
from tests.support.moves import promote
from tests.support.registries import open_sqlite_registry, sign

ORDERS = "initech/tiny-llama/orders"


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
    cases = tenant_tasks.golden_cases("orders")
    cases[4]["slice"] = bad_slice
    with pytest.raises(InvalidInput) as refused:
        parse_golden_set(_golden_bytes(cases), min_cases=5)
    assert refused.value.code == ErrorCode.INVALID_GOLDEN_SET and refused.value.field == "golden_set"
    assert "expect_column_values_to_match_json_schema(slice): 1 bad" in refused.value.message


def test_slices_are_optional_and_name_each_key_and_their_combination():
    cases = tenant_tasks.golden_cases("orders")
    del cases[0]["slice"]
    golden = parse_golden_set(_golden_bytes(cases), min_cases=5)
    assert golden.cases[0].slice_labels == []
    assert golden.cases[1].slice_labels == ["intent=refund", "lang=en", "intent=refund,lang=en"]
    # the slice is part of the set's identity: relabelling a case is a new set
    assert golden.digest != tenant_tasks.golden_set("orders").digest


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
    golden = tenant_tasks.golden_set("orders")
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
        for e in tenant_tasks.TASKS["orders"]["examples"]
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
    registry.attach_golden_set(name, tenant_tasks.write_golden_set(task, tmp_path / f"{task}.jsonl"))
    return vid


def _in_production(registry: Registry, vid: str, monkeypatch, capsys) -> str:
    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", vid, "--threshold", "0.5", "--json")
    assert rc == 0, out
    sign(registry, vid)
    promote(registry, vid, "canary")
    promote(registry, vid, "production")
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

    from loragate.registry.rules.access import Role
    from loragate.tasks.validation.prefect_tasks import shadow_validate

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
