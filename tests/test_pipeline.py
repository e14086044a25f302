"""The promotion pipeline end to end: a real ``prefect server start`` (its scheduler runs the
canary evaluations), loragate deployed on it with ``prefect deploy --all``, a process worker
per pool, the Postgres registry, the session's real vLLM replicas, S3 over HTTP for a
bundle, and a recording Slack endpoint.

One scenario walks a tenant adapter through every gate: a training-completed event, register
(one bundle rejected at the door), shadow validation, canary, scheduled evaluations, the
promotion paused for a sign-off given from the CLI, a second version signed off in the
Prefect UI in a real browser, and a rollback. Further tests cover the automatic rollback of
a canary that drifts, and a flow run killed mid-switch and re-run from the top.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from infra.modelkit import golden_cases
from infra.pipeline import LocalPipeline, PipelineSecrets, start_pipeline
from registry.errors import NotFound
from registry.rules.access import Role, split_token
from registry.rules.canary import ACTIVE, WindowStatus
from registry.rules.fleet import version_path
from registry.service import Registry
from registry.settings import Settings
from registry.storage.signing import key_id
from tasks.fleet import switch_replica
from tasks.naming import artifact_key
from tasks.replicas import ReplicaClient
from tasks.validation import ValidationPolicy, validate_versions
from tests.support.browser import approve_in_ui
from tests.support.faults import Fault, FaultProxy
from tests.support.flow_processes import processes_running
from tests.support.prefect_env import client_env, prefect_server_fixture, wait_for_state  # noqa: F401
from tests.support.registries import IN_PROCESS, SIGNING_KEY
from tests.support.slack import RecordingSlack

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
WINDOW_S = 6
EVALUATE_EVERY_S = 15


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 240.0, every_s: float = 0.5) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        time.sleep(every_s)


class Stack:
    """What the scenario runs against, and how it looks at it."""

    def __init__(
        self,
        pipeline: LocalPipeline,
        settings: Settings,
        slack: RecordingSlack,
        replicas,
        tmp: Path,
        people: dict[str, str],
        tokens: dict[Role, str],
    ):
        self.pipeline = pipeline
        self.people = people  # activation tokens of the people who sign off
        self.tokens = tokens  # the gates', one per pool's secrets directory
        self.settings = settings
        self.slack = slack
        self.replicas = replicas
        self.tmp = tmp
        self.registry = Registry.open(settings, principal=IN_PROCESS)

    def emit_training(self, bundle: str, name: str, golden: Path | None = None) -> None:
        from flows.events import announce_training_completed

        with client_env(self.pipeline.server):
            announce_training_completed(bundle, name, {"job": "test"}, str(golden) if golden else None)

    def version_from(self, name: str, weights_sha256_prefix: str) -> str | None:
        try:
            versions = self.registry.list_versions(name)
        except NotFound:
            return None
        found = [v.version_id for v in versions if v.version_id.endswith(weights_sha256_prefix)]
        return found[0] if found else None

    def stage(self, version_id: str) -> str:
        return self.registry.get_version(version_id).stage.value

    def waiting_run(self, version_id: str) -> str | None:
        try:
            window = self.registry.latest_canary_window(version_id)
        except NotFound:
            return None
        return window.approval_flow_run_id if window.status == WindowStatus.READY else None

    def served(self, key: str) -> dict[str, str]:
        with ReplicaClient(self.replicas[key].url) as client:
            return client.served_adapters()

    def loragate(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).parent / "loragate"), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **self.pipeline.env, **({"LORAGATE_TOKEN": token} if token else {})},
            timeout=120,
        )

    def events(self, prefix: str = "loragate.") -> list[dict[str, Any]]:
        response = httpx.post(
            f"{self.pipeline.server.api_url}/events/filter",
            json={"filter": {"event": {"prefix": [prefix]}, "order": "ASC"}, "limit": 50},
            headers=self.pipeline.server.auth_headers(),
            timeout=30,
        )
        response.raise_for_status()
        page = response.json()
        found = page["events"]
        while page.get("next_page"):
            page = httpx.get(page["next_page"], headers=self.pipeline.server.auth_headers(), timeout=30)
            page = page.raise_for_status().json()
            found += page["events"]
        return found

    def everything_prefect_holds(self) -> str:
        """Everything the Prefect API hands whoever holds its credential: block documents
        with their secrets revealed, variables, deployments (parameters, job variables),
        work pools (base job templates), flow-run parameters, artifacts and logs."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import LogFilter

        with client_env(self.pipeline.server), get_client(sync_client=True) as client:
            blocks = client.read_block_documents(include_secrets=True)
            variables = client.read_variables()
            deployments = client.read_deployments()
            pools = client.read_work_pools()
            runs = client.read_flow_runs(limit=200)
            artifacts = client.read_artifacts(limit=200)
            logs = []
            offset = 0
            while True:
                page = client.read_logs(log_filter=LogFilter(), limit=200, offset=offset)
                logs += page
                if len(page) < 200:
                    break
                offset += 200
        return "\n".join(
            [b.model_dump_json(context={"include_secrets": True}) for b in blocks]
            + [v.model_dump_json() for v in variables]
            + [
                d.model_dump_json(include={"parameters", "job_variables", "parameter_openapi_schema"})
                for d in deployments
            ]
            + [p.model_dump_json(include={"base_job_template"}) for p in pools]
            + [r.model_dump_json(include={"parameters", "job_variables"}) for r in runs]
            + [a.model_dump_json(include={"data", "description"}) for a in artifacts]
            + [entry.message for entry in logs]
        )

    def artifact_descriptions(self, key: str) -> list[str]:
        """Every version of the artifact ``key``, oldest first: what each one said."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        with client_env(self.pipeline.server), get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        return [a.description or "" for a in sorted(found, key=lambda a: a.created or 0)]

    def artifact_keys(self) -> set[str]:
        from prefect.client.orchestration import get_client

        with client_env(self.pipeline.server), get_client(sync_client=True) as client:
            return {a.key for a in client.read_artifacts() if a.key}

    @contextmanager
    def schedules_paused(self, *deployments: str) -> Iterator[None]:
        """No scheduled runs of these deployments start inside the block, and none is in
        flight when it begins: a test that sets up a fault step by step must not be judged
        (or repaired) half way."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            DeploymentFilter,
            DeploymentFilterId,
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
        )
        from prefect.client.schemas.objects import StateType

        with client_env(self.pipeline.server), get_client(sync_client=True) as client:
            ids = [client.read_deployment_by_name(name).id for name in deployments]
            for deployment_id in ids:
                client.pause_deployment(deployment_id)

            def in_flight() -> bool:
                runs = client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=ids)),
                    flow_run_filter=FlowRunFilter(
                        state=FlowRunFilterState(
                            type=FlowRunFilterStateType(any_=[StateType.PENDING, StateType.RUNNING])
                        )
                    ),
                )
                return bool(runs)

            try:
                wait_until(f"in-flight runs of {', '.join(deployments)}", lambda: not in_flight(), timeout_s=120)
                yield
            finally:
                for deployment_id in ids:
                    client.resume_deployment(deployment_id)

    def flow_run_state(self, flow_run_id: str) -> str:
        from prefect.client.orchestration import get_client

        with client_env(self.pipeline.server), get_client(sync_client=True) as client:
            state = client.read_flow_run(uuid.UUID(flow_run_id)).state
            return state.type.value if state else "?"


@pytest.fixture(scope="module")
def stack(prefect_server, pg_template, replicas, replica_adapters, tiny_base, s3_endpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    slack = RecordingSlack()
    env = {
        "LORAGATE_DATABASE_URL": pg_template(),
        "LORAGATE_ARTIFACTS": str(tmp / "artifacts"),
        "LORAGATE_HOME": str(tmp / "home"),
        "LORAGATE_ACTOR": "pipeline",
        "LORAGATE_S3_ENDPOINT_URL": s3_endpoint,
        "LORAGATE_CANARY_WINDOW_S": str(WINDOW_S),
        # three replicas, five workers and a server share two cores: a p95 of a few requests
        # swings by half a second and more -- the machine, not the adapter. A latency
        # rollback here would be chance; drift and errors stay strict, and the latency rule
        # is a row of tests/test_canary.py's verdict table
        "LORAGATE_CANARY_P95_SLACK_MS": "5000",
        "LORAGATE_APPROVAL_POLL_S": "1",
        "LORAGATE_UI_URL": prefect_server.ui_url,
        "LORAGATE_SLACK_CHANNEL": "#adapters",
        "LORAGATE_SLACK_BASE_URL": slack.base_url,
        "HF_HUB_OFFLINE": "1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    settings = Settings(
        database_url=env["LORAGATE_DATABASE_URL"], artifacts=env["LORAGATE_ARTIFACTS"], home=tmp / "home"
    )
    with Registry.open(settings, principal=IN_PROCESS) as registry:
        registry.add_base(str(tiny_base), "tiny-llama")
        for replica in replicas.values():
            registry.add_replica(replica.url, "tiny-llama", replica.role, str(replica_adapters))
        # each gate acts with its own role's token, from its pool's secrets directory; people sign off
        # with their own activation tokens
        tokens = {role: registry.create_token(role.value, f"pipeline-{role.value}", pipeline=True)[1] for role in Role}
        people = {who: registry.create_token("activation", who)[1] for who in ("alice", "bob")}
        registry.add_signing_key(SIGNING_KEY.public_pem, "signing", "pipeline")
    # the Slack token too comes from the pools' secrets directories: the workers' environment has none
    secrets = PipelineSecrets(tokens, SIGNING_KEY.private_pem, "xoxb-test-token")
    # each scheduled run is a process on two shared cores: evaluations every 5 s ran back to
    # back, and a reconcile and a sweep every minute, slowed every gate under test 2-3x. Here
    # reconcile and the sweep run only when a test starts them
    pipeline = start_pipeline(
        tmp / "prefect",
        env,
        secrets,
        evaluate_every_s=EVALUATE_EVERY_S,
        reconcile_every_s=None,
        advance_every_s=None,
        server=prefect_server,
    )
    made = Stack(pipeline, settings, slack, replicas, tmp, people, tokens)
    try:
        yield made
    finally:
        pipeline.stop()
        made.registry.close()
        slack.close()
        for worker_log in prefect_server.home.glob("worker-*.log"):
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / worker_log.name).write_text(worker_log.read_text(errors="replace"))


def golden_file(tmp: Path) -> Path:
    path = tmp / "golden-support.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in golden_cases("support")))
    return path


def upload_bundle(s3_endpoint: str, bundle: Path) -> str:
    bucket = f"training-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=bucket)
    for f in bundle.iterdir():
        s3.upload_file(str(f), bucket, f"run-1/{f.name}")
    return f"s3://{bucket}/run-1"


def weights_prefix(bundle: Path) -> str:
    from registry.intake.digests import sha256_file

    return sha256_file(bundle / "adapter_model.safetensors")[:12]


def through_canary(stack: Stack, name: str, bundle: Path, location: str, golden: Path) -> tuple[str, str]:
    """Emit the training event and wait until the promotion waits for a sign-off:
    (version, the paused promote run)."""
    stack.emit_training(location, name, golden)
    version = wait_until("the register flow", lambda: stack.version_from(name, weights_prefix(bundle)))
    wait_until("shadow validation and the canary gate", lambda: stack.stage(version) == "canary")
    assert stack.served("canary")[name] == version_path(stack.registry.list_replicas()[0].adapter_dir, name, version), (
        "the canary replica serves the new version"
    )
    run_id = wait_until("a window in band and a paused promotion", lambda: stack.waiting_run(version))
    wait_for_state(stack.pipeline.server, uuid.UUID(run_id), "PAUSED", timeout_s=60)
    # waiting for a person costs the worker nothing: the suspended run's process has ended
    wait_until("the waiting run's process to end", lambda: not processes_running({run_id}), timeout_s=60)
    return version, run_id


def test_a_training_event_goes_through_every_gate_to_production_and_back(
    stack, support_bundle, retrained_support_bundle, s3_endpoint
):
    from infra import corpus

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
    assert all(stack.served(k)[name] == path_v2 for k in ("prod-a", "prod-b", "canary"))

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
    assert all(stack.served(k)[name] == path_v1 for k in ("prod-a", "prod-b", "canary"))

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
    return version, other


def run_canary_deployment(stack: Stack, version: str):
    from prefect.deployments import run_deployment

    with client_env(stack.pipeline.server):
        return run_deployment("canary/canary", parameters={"version_id": version}, timeout=180)


def test_a_canary_whose_answers_drift_is_rolled_back_automatically(stack, support_bundle, tickets_bundle):
    name = f"d{uuid.uuid4().hex[:6]}/tiny-llama/support"
    version, other = validated_canary(stack, name, support_bundle, tickets_bundle)
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
            # name (a bad disk, a wrong path): its golden answers drift from validation's
            canary = stack.replicas["canary"]
            wrong = stack.registry.materialize(other, stack.tmp / f"wrong-{other}")
            with ReplicaClient(canary.url) as client:
                switch_replica(client, name, str(wrong))

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
        script = f"from flows.canary import canary_flow; canary_flow({version!r})"
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


def test_a_version_whose_event_was_lost_is_carried_on_by_the_advance_sweep(stack, support_bundle):
    """Validated in process, so no ``loragate.adapter.validated`` event was ever emitted and
    no trigger will act: the sweep finds it waiting for the canary and starts that gate."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.deployments import run_deployment

    name = f"a{uuid.uuid4().hex[:6]}/tiny-llama/support"
    version = stack.registry.register_adapter(support_bundle, name).version.version_id
    stack.registry.attach_golden_set(name, golden_file(stack.tmp))
    reports = validate_versions(stack.registry, [version], ValidationPolicy.from_settings(stack.settings))
    assert reports[0].status.value == "passed", reports[0].failures
    assert [w.gate.value for w in stack.registry.waiting() if w.version_id == version] == ["canary"]

    # the sweep, as its schedule would start it (the test stack has none)
    with client_env(stack.pipeline.server):
        run = run_deployment("advance/advance", parameters={"after_s": 0}, timeout=120)
    assert run.state is not None and run.state.is_completed(), run.state
    with client_env(stack.pipeline.server), get_client(sync_client=True) as client:
        started = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=["advance"])))
    assert [r.parameters for r in started if r.parameters.get("version_id") == version] == [{"version_id": version}]
    wait_until("the canary run the sweep started", lambda: stack.stage(version) == "canary", timeout_s=180)
    assert "advance" in stack.artifact_keys()
    window = stack.registry.latest_canary_window(version)
    # closed, so the scheduled evaluations do not probe it
    stack.registry.close_canary_window(window.id, WindowStatus.ROLLED_BACK, "test over")
