"""The weight scan: adaptersentry reads an adapter's weights before anything loads them.

On a 16-layer base, where each module family has enough members to compare within the
adapter, a planted outlier is flagged and a normal adapter allowed; ``block`` rejects the
adapter without loading it, and ``review`` reaches production only when the approval
acknowledges it -- from a shell and through the promote flow's sign-off alike, where a
replayed or forged acknowledgement moves nothing. The registry and CLI helpers are
``test_gate_quality.py``'s (slice regression, the gate's other check beyond a pass rate).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from kit import basekit, corpus, modelkit
from loragate.registry.errors import ErrorCode, IllegalTransition
from loragate.registry.service import Registry
from loragate.tasks.validation.policy import ValidationPolicy
from loragate.tasks.validation.scan import scan_weights
from tests import test_gate_quality
from tests.support.commands import role_tokens
from tests.support.moves import promote
from tests.support.prefect_env import client_env, prefect_server_fixture, wait_for_state  # noqa: F401  (a fixture)
from tests.support.registries import mark_ready, sign
from tests.test_gate_quality import _cli, _register

SUPPORT = "acme/deep-llama/support"
# test_gate_quality's fixture: a SQLite registry for the model-loading tests
sqlite_registry = test_gate_quality.sqlite_registry

SCAN_POLICY = ValidationPolicy(
    pass_threshold=0.5, max_lora_rank=16, noop_tolerance=1e-4, device="cpu", hf_cache_dir=None
)


@pytest.fixture(scope="session")
def deep_base(kit) -> Path:
    """16 layers: enough modules per family for adaptersentry to compare within the adapter."""
    return basekit.build_base(kit / "deep-llama", num_layers=16)


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
    promote(registry, vid, "canary")  # the canary needs no acknowledgement: it is the next look

    # the sign-off from a shell is refused before anything resumes
    window, _ = registry.open_canary_window(vid)
    mark_ready(registry, window.id)
    registry.request_approval(window.id, str(uuid.uuid4()))
    registry.create_token("activation", "alice")
    rc, _, err = _cli(registry, monkeypatch, capsys, "approve", vid)
    assert rc == 2 and err.count("\n") == 1
    assert "under weight-scan review" in err and "--acknowledge-scan-review" in err

    with pytest.raises(IllegalTransition) as refused:
        promote(registry, vid, "production")
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

    from loragate.flows.promote import promote_flow
    from loragate.registry.rules.access import Role

    registry = deep_registry
    vid = _register(registry, deep_adapters["trained-planted"], SUPPORT, "support", tmp_path)
    rc, out, _ = _cli(registry, monkeypatch, capsys, "validate", vid, "--threshold", "0.5", "--json")
    assert rc == 0 and json.loads(out)["reports"][0]["scan"]["action"] == "review"
    sign(registry, vid)
    promote(registry, vid, "canary")
    window, _ = registry.open_canary_window(vid)
    mark_ready(registry, window.id)
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
