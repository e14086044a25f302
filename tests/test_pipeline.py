"""The promotion pipeline end to end: a real ``prefect server start`` (its scheduler runs the
canary evaluations), loragate deployed on it with ``prefect deploy --all``, a warm worker
per pool, the Postgres registry, the session's real vLLM replicas, S3 over HTTP for a
bundle, and a recording Slack endpoint.

One scenario walks a tenant adapter through every gate: a training-completed event, register
(one bundle rejected at the door), shadow validation, canary, scheduled evaluations, the
promotion paused for a sign-off given from the CLI, a second version signed off in the
Prefect UI in a real browser, and a rollback. Further tests cover the automatic rollback of
a canary that drifts, a flow run killed mid-switch and re-run from the top, and the
``advance`` sweep carrying on a version whose event was lost and whose run died. The stack
they run against is ``tests/support/pipeline_stack.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kit.http_faults import Fault, FaultProxy
from loragate.registry.errors import NotFound
from loragate.registry.rules.access import split_token
from loragate.registry.rules.canary import ACTIVE, WindowStatus
from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.registry.storage.signing import key_id
from loragate.tasks.naming import artifact_key
from loragate.tasks.replica_switch import switch_replica
from loragate.tasks.validation import ValidationPolicy, validate_versions
from tests.support.browser import approve_in_ui
from tests.support.fleet import admin_client
from tests.support.pipeline_stack import (  # noqa: F401  (a fixture)
    ARTIFACTS,
    ROOT,
    UNRESPONSIVE_AFTER_S,
    Stack,
    golden_file,
    stack_fixture,
    through_canary,
    upload_bundle,
    wait_until,
)
from tests.support.prefect_env import client_env, prefect_server_fixture, wait_for_state  # noqa: F401
from tests.support.registries import IN_PROCESS, SIGNING_KEY, mark_validated

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_a_training_event_goes_through_every_gate_to_production_and_back(
    stack, support_bundle, retrained_support_bundle, s3_endpoint
):
    from kit import corpus

    name = f"p{uuid.uuid4().hex[:6]}/tiny-llama/support"
    golden = golden_file(stack.tmp)

    # a bundle PEFT would load with no effect is refused at the door, loudly
    broken = corpus.renamed_layer_prefix(support_bundle, stack.tmp / "renamed")
    stack.emit_training(str(broken), name, golden)
    rejected = wait_until(
        "the rejection event",
        lambda: [e for e in stack.events("loragate.adapter.rejected") if e["payload"]["name"] == name],
    )
    assert rejected[0]["payload"]["code"] == "base_mismatch" or rejected[0]["payload"]["field"]
    with pytest.raises(NotFound):
        stack.registry.list_versions(name)  # nothing was written

    # v1 from S3 through validation and canary; signed off from the CLI
    v1, run1 = through_canary(stack, name, support_bundle, upload_bundle(s3_endpoint, support_bundle), golden)
    assert name not in stack.served("prod-a"), "production has no version of this adapter yet"
    # a trainer cannot sign off, nor can alice sign off in someone else's name
    with Registry.open(stack.settings, principal=IN_PROCESS) as registry:
        trainer = registry.create_token("training", "trainer")[1]
    denied = stack.loragate("approve", v1, "--reviewer", "alice", token=trainer)
    assert denied.returncode == 3 and denied.stderr.startswith("error: permission denied: "), denied.stderr
    nobody = stack.loragate("approve", v1, "--reviewer", "bob", token=stack.people["alice"])
    assert nobody.returncode == 3 and "you sign off as alice" in nobody.stderr, nobody.stderr
    assert stack.flow_run_state(run1) == "PAUSED", "a refused sign-off resumes nothing"
    approved = stack.loragate(
        "approve", v1, "--reviewer", "alice", "--comment", "canary clean", token=stack.people["alice"]
    )
    assert approved.returncode == 0, approved.stderr
    wait_until("v1 in production", lambda: stack.stage(v1) == "production")
    wait_for_state(stack.pipeline.server, uuid.UUID(run1), "COMPLETED", timeout_s=120)
    assert all(name in stack.served(k) for k in ("prod-a", "prod-b", "canary"))

    # v2 (another training run) signed off in the Prefect UI, in a real browser
    v2, run2 = through_canary(stack, name, retrained_support_bundle, str(retrained_support_bundle), golden)
    ARTIFACTS.mkdir(exist_ok=True)
    refusals = artifact_key("approval-refused", name)

    def refused_with(code: str) -> bool:
        return any(code in d for d in stack.artifact_descriptions(refusals))

    # whoever reaches the Prefect API resumes the run as bob, without a code: refused, it waits again
    from prefect.flow_runs import resume_flow_run

    with client_env(stack.pipeline.server):
        resume_flow_run(uuid.UUID(run2), run_input={"approve": True, "reviewer": "bob", "comment": "no code"})
    wait_until("the refusal of a resume without a code", lambda: refused_with("approval_code_invalid"))
    wait_for_state(stack.pipeline.server, uuid.UUID(run2), "PAUSED", timeout_s=60)
    # in the UI, as bob, with a code alice got: refused too
    alices = json.loads(stack.loragate("approve-code", v2, "--json", token=stack.people["alice"]).stdout)["code"]
    ui = stack.pipeline.server.ui_url
    login = stack.pipeline.server.auth_string
    approve_in_ui(ui, run2, approve=True, reviewer="bob", comment="not mine", code=alices, login=login)
    wait_until("the refusal of someone else's code", lambda: refused_with("approval_code_mismatch"))
    wait_for_state(stack.pipeline.server, uuid.UUID(run2), "PAUSED", timeout_s=60)
    assert stack.registry.get_adapter(name).production == v1, "no refused sign-off moved production"
    # bob's own code, typed into the form: production moves
    issued = stack.loragate("approve-code", v2, "--json", token=stack.people["bob"])
    assert issued.returncode == 0, issued.stderr
    bobs = json.loads(issued.stdout)
    approve_in_ui(
        ui,
        run2,
        approve=True,
        reviewer="bob",
        comment="approved in the UI",
        code=bobs["code"],
        screenshot=ARTIFACTS / "pipeline-approval-form.png",
        login=login,
    )
    wait_until("v2 in production", lambda: stack.stage(v2) == "production")
    wait_for_state(stack.pipeline.server, uuid.UUID(run2), "COMPLETED", timeout_s=120)
    adapter = stack.registry.get_adapter(name)
    assert (adapter.production, adapter.previous, adapter.canary) == (v2, v1, None)
    # the validate gate signed both with the pipeline's key; production verified it
    assert [s.key_id for s in stack.registry.signatures(v2)] == [key_id(SIGNING_KEY.public_pem)]
    path_v2 = version_path(str(stack.registry.list_replicas()[0].adapter_dir), name, v2)
    # production's users moved to the canary warm there: no reload (docs/live-traffic.md)
    assert all(stack.serves_version(k, name, v2, path_v2) for k in ("prod-a", "prod-b", "canary"))

    # rollback: the deployment, as anyone who reaches the Prefect API runs it -- without a
    # code it fails and moves nothing; with alice's rollback code it rolls back
    from prefect.deployments import run_deployment

    rollback = {"name": name, "expected_version": v2, "reason": "tenant reports regressions"}
    with client_env(stack.pipeline.server):
        refused_run = run_deployment("rollback/rollback", parameters=rollback, timeout=180)
    assert refused_run.state is not None and refused_run.state.is_failed(), refused_run.state
    assert stack.registry.get_adapter(name).production == v2, "a rollback without a code moved production"
    issued = stack.loragate("approve-code", v2, "--rollback", "--json", token=stack.people["alice"])
    assert issued.returncode == 0, issued.stderr
    with client_env(stack.pipeline.server):
        run = run_deployment(
            "rollback/rollback", parameters={**rollback, "code": json.loads(issued.stdout)["code"]}, timeout=180
        )
    assert run.state is not None and run.state.is_completed(), run.state
    assert stack.registry.get_adapter(name).production == v1
    path_v1 = version_path(str(stack.registry.list_replicas()[0].adapter_dir), name, v1)
    assert all(stack.serves_version(k, name, v1, path_v1) for k in ("prod-a", "prod-b", "canary"))

    # the record: audit, events, artifacts, Slack
    approvals = [e for e in stack.registry.history(name) if e.action == "approval"]
    assert [(e.version_id, e.details["reviewer"], e.details["comment"], e.to_value) for e in approvals] == [
        (v1, "alice", "canary clean", "approved"),
        (v2, "bob", "approved in the UI", "approved"),
    ]
    # each sign-off names the token that proved it: the reviewer's own, never the pipeline's
    people_ids = {who: split_token(token)[0] for who, token in stack.people.items()}
    assert [e.details["token_id"] for e in approvals] == [people_ids["alice"], people_ids["bob"]]
    assert approvals[1].details["approval_code"] == bobs["code_id"]
    refused = [e.to_value for e in stack.registry.history(name) if e.action == "approval_refused"]
    assert refused == ["approval_code_invalid", "approval_code_mismatch", "approval_code_invalid"]
    (asked,) = [e for e in stack.registry.history(name) if e.action == "rollback_approval"]
    assert (asked.version_id, asked.details["token_id"]) == (v2, people_ids["alice"])
    expected_events = [
        ("loragate.adapter.registered", v1),
        ("loragate.adapter.validated", v1),
        ("loragate.canary.started", v1),
        ("loragate.canary.ready", v1),
        ("loragate.adapter.promoted", v1),
        ("loragate.adapter.promoted", v2),
        ("loragate.adapter.rolled-back", v1),
    ]

    def seen() -> list[tuple[str, str | None]]:
        return [
            (e["event"], e["payload"].get("version_id")) for e in stack.events() if e["payload"].get("name") == name
        ]

    # the server persists events in batches (every 5 s by default): the rollback's may lag its run
    deadline = time.monotonic() + 30
    stored = seen()
    while not all(x in stored for x in expected_events) and time.monotonic() < deadline:
        time.sleep(1)
        stored = seen()
    for expected in expected_events:
        assert expected in stored, (expected, stored)
    keys = stack.artifact_keys()
    slug = name.replace("/", "-")
    assert {
        f"canary-{slug}",
        f"canary-{slug}-verdict",
        f"approval-{slug}",
        f"rejected-{slug}",
        "shadow-validation",
    } <= keys
    texts = [m.text for m in stack.slack.messages if name in m.text]
    for headline, version in [
        ("Rejected at register", None),
        ("Canary started", v1),
        ("Awaiting approval", v1),
        ("Promoted to production", v1),
        ("Promoted to production", v2),
        ("Rolled back", v1),
    ]:
        assert any(headline in t and (version is None or version in t) for t in texts), (headline, version, texts)
    # v2's run was resumed three times (two refusals, then bob's code): it asked Slack once
    assert len([t for t in texts if "Awaiting approval" in t and v2 in t]) == 1, texts
    assert all(m.authorized for m in stack.slack.messages)
    # the gates acted as the pipeline's role tokens, and no secret reached the record
    actors = {e.action: e.actor for e in stack.registry.history(name)}
    assert actors["register"].startswith("pipeline-training (training token ")
    assert actors["validate"].startswith("pipeline-signing (signing token ")
    assert actors["approval"].startswith("pipeline-activation (activation token ")
    held = stack.everything_prefect_holds()
    record = json.dumps([e.as_dict() for e in stack.registry.history(name)], default=str)
    secrets = [*stack.tokens.values(), *stack.people.values(), "xoxb-test-token"]
    secrets.append(SIGNING_KEY.private_pem.decode().splitlines()[1])  # a line of the key's body
    for secret in secrets:
        assert secret not in held and secret not in record
    assert any(f"/runs/flow-run/{run1}" in t for t in texts), "the approval message links to the paused run"


def validated_canary(stack: Stack, name: str, bundle: Path, tickets_bundle: Path) -> tuple[str, str]:
    """A validated version of a fresh adapter (validated here, not by the pipeline), plus a
    validated version of the tickets adapter under another name, to sabotage a replica with."""
    version = stack.registry.register_adapter(bundle, name).version.version_id
    stack.registry.attach_golden_set(name, golden_file(stack.tmp))
    other_name = name.replace("/support", "/tickets")
    other = stack.registry.register_adapter(tickets_bundle, other_name).version.version_id
    policy = ValidationPolicy.from_settings(stack.settings)
    reports = validate_versions(stack.registry, [version], policy)
    assert reports[0].status.value == "passed", reports[0].failures
    stack.registry.sign_version(version, SIGNING_KEY.private_pem)  # as the validate gate does
    return version, other


def run_canary_deployment(stack: Stack, version: str):
    from prefect.deployments import run_deployment

    with client_env(stack.pipeline.server):
        return run_deployment("canary/canary", parameters={"version_id": version}, timeout=180)


def test_a_canary_whose_answers_drift_is_rolled_back_automatically(stack, support_bundle, tickets_bundle):
    name = f"d{uuid.uuid4().hex[:6]}/tiny-llama/support"
    version, _ = validated_canary(stack, name, support_bundle, tickets_bundle)
    stack.slack.clear()
    # a scheduled reconcile would repair the drift below before the evaluation sees it
    with stack.schedules_paused("reconcile/reconcile"):
        # and an evaluation after the (seconds-long) window but before the drift is in place
        # would judge it in band
        with stack.schedules_paused("canary-evaluate/canary-evaluate"):
            run = run_canary_deployment(stack, version)
            assert run.state is not None and run.state.is_completed(), run.state
            window = stack.registry.latest_canary_window(version)
            assert window.status == WindowStatus.OPEN

            # the canary replica starts answering with other weights under the adapter's
            # name: its golden answers drift from validation's. The replica loads only what
            # the registry lets it serve, so the other weights are a validated version of
            # this adapter (what a stale switch would leave), loaded with the fleet's key
            canary = stack.replicas["canary"]
            drifted = stack.registry.register_adapter(tickets_bundle, name).version.version_id
            mark_validated(stack.registry, drifted, signed=False)
            wrong = version_path(stack.registry.list_replicas()[0].adapter_dir, name, drifted)
            stack.registry.materialize(drifted, Path(wrong))
            with admin_client(stack.registry, canary.url) as client:
                switch_replica(client, name, wrong)

        closed = wait_until(
            "the automatic rollback",
            lambda: (w := stack.registry.canary_window(window.id)).status == WindowStatus.ROLLED_BACK and w,
            timeout_s=120,
        )
    assert "golden_drift" in (closed.reason or "")
    assert stack.stage(version) == "rolled_back"
    assert stack.registry.get_adapter(name).canary is None
    assert name not in stack.served("canary"), "the canary replica no longer serves the withdrawn version"
    rollback = [e for e in stack.registry.history(name) if e.action == "rollback"]
    assert rollback and "out of band" in (rollback[-1].reason or "")
    # the flow posts to Slack after it closes the window: wait for the post, not a moment
    wait_until(
        "the rollback's Slack notice",
        lambda: any("Rolled back" in m.text and version in m.text for m in stack.slack.messages),
        timeout_s=60,
    )


def test_a_canary_flow_killed_mid_switch_and_rerun_from_the_top_converges(stack, support_bundle, tickets_bundle):
    name = f"k{uuid.uuid4().hex[:6]}/tiny-llama/support"
    version, _ = validated_canary(stack, name, support_bundle, tickets_bundle)
    canary = stack.replicas["canary"]
    adapter_dir = stack.registry.list_replicas()[0].adapter_dir
    path = version_path(adapter_dir, name, version)
    # the canary replica is reached through a proxy that holds the switch's verification
    proxy = FaultProxy(canary.url)
    stack.registry.remove_replica(canary.url)
    stack.registry.add_replica(proxy.url, "tiny-llama", "canary", adapter_dir)
    try:
        proxy.set(Fault.HOLD_COMPLETIONS)
        script = f"from loragate.flows.canary import canary_flow; canary_flow({version!r})"
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            env={**os.environ, **stack.pipeline.pool_env("canary")},  # as the canary deployment's worker
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # kill -9 while the switch is verifying: the replica serves the new path, the
            # registry has not moved
            assert proxy.holding.wait(180), "the canary flow never reached the verification"
            os.killpg(process.pid, signal.SIGKILL)
        finally:
            process.wait(timeout=30)
            proxy.release()
        assert process.returncode == -signal.SIGKILL
        assert stack.served("canary")[name] == path, "the replica was switched"
        assert stack.registry.get_adapter(name).canary is None, "the pointer did not move"
        assert stack.registry.canary_windows(None, version_id=version) == []

        run = run_canary_deployment(stack, version)
        assert run.state is not None and run.state.is_completed(), run.state
        again = run_canary_deployment(stack, version)  # and once more: nothing changes
        assert again.state is not None and again.state.is_completed(), again.state
        assert stack.registry.get_adapter(name).canary == version
        windows = stack.registry.canary_windows(None, version_id=version)
        # the scheduled evaluation may already have judged it in band (the window is seconds
        # long here): still the one window the first completed run opened
        assert len(windows) == 1, "one window, however many runs"
        assert windows[0].status in ACTIVE, windows[0]
        assert stack.served("canary")[name] == path
        assert name not in stack.served("prod-a")
        # closed, so the scheduled evaluations of later tests do not probe it
        stack.registry.close_canary_window(windows[0].id, WindowStatus.ROLLED_BACK, "test over")
    finally:
        stack.registry.remove_replica(proxy.url)
        stack.registry.add_replica(canary.url, "tiny-llama", "canary", adapter_dir)
        proxy.close()


def test_a_version_whose_event_was_lost_and_whose_run_died_is_carried_on_by_the_advance_sweep(stack, support_bundle):
    """Validated in process, so no ``loragate.adapter.validated`` event was ever emitted and
    no trigger will act; and a canary run for it is RUNNING with no process behind it (as
    when a worker dies with its runs: created RUNNING here, so no worker ever held it). The
    sweep crashes that run once it has been silent past the limit, finds the version waiting
    for the canary with no live run, and starts that gate."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.deployments import run_deployment
    from prefect.states import Running

    name = f"a{uuid.uuid4().hex[:6]}/tiny-llama/support"
    version = stack.registry.register_adapter(support_bundle, name).version.version_id
    with client_env(stack.pipeline.server), get_client(sync_client=True) as client:
        canary = client.read_deployment_by_name("canary/canary")
        dead = client.create_flow_run_from_deployment(canary.id, parameters={"version_id": version}, state=Running())
    stack.registry.attach_golden_set(name, golden_file(stack.tmp))
    reports = validate_versions(stack.registry, [version], ValidationPolicy.from_settings(stack.settings))
    assert reports[0].status.value == "passed", reports[0].failures
    stack.registry.sign_version(version, SIGNING_KEY.private_pem)  # as the validate gate does
    assert [w.gate.value for w in stack.registry.waiting() if w.version_id == version] == ["canary"]
    # the dead run's last event (Running) older than the stack's LORAGATE_UNRESPONSIVE_AFTER_S
    silent_until = dead.created.timestamp() + UNRESPONSIVE_AFTER_S + 3
    time.sleep(max(0.0, silent_until - time.time()))

    # the sweep, as its schedule would start it (the test stack has none)
    with client_env(stack.pipeline.server):
        run = run_deployment("advance/advance", parameters={"after_s": 0}, timeout=120)
    assert run.state is not None and run.state.is_completed(), run.state
    with client_env(stack.pipeline.server), get_client(sync_client=True) as client:
        crashed = client.read_flow_run(dead.id)
        started = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=["advance"])))
    assert crashed.state.type.value == "CRASHED", crashed.state
    assert f"no event for {UNRESPONSIVE_AFTER_S:g} s" in (crashed.state.message or "")
    assert "unresponsive" in stack.artifact_keys()
    assert [r.parameters for r in started if r.parameters.get("version_id") == version] == [{"version_id": version}]
    wait_until("the canary run the sweep started", lambda: stack.stage(version) == "canary", timeout_s=180)
    assert "advance" in stack.artifact_keys()
    window = stack.registry.latest_canary_window(version)
    # closed, so the scheduled evaluations do not probe it
    stack.registry.close_canary_window(window.id, WindowStatus.ROLLED_BACK, "test over")
