"""The promotion pipeline's test stack: loragate deployed on the session's real Prefect
server with a warm worker per pool, the Postgres registry, the session's vLLM replicas, S3
over HTTP and a recording Slack endpoint -- and what the pipeline tests ask of it (the
``stack`` fixture, one per test module that imports it)."""

from __future__ import annotations

import json
import os
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

from kit.flow_processes import processes_running
from kit.tenant_tasks import golden_cases
from loragate.local.pipeline import POOLS, LocalPipeline, PipelineSecrets, start_pipeline
from loragate.local.replica_secrets import ADMIN_KEY_FILE, hand_admin_key
from loragate.registry.errors import NotFound
from loragate.registry.rules.access import Role
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.tasks.replicas import ReplicaClient
from tests.support.fleet import point_replicas
from tests.support.prefect_env import client_env, wait_for_state
from tests.support.registries import IN_PROCESS, SIGNING_KEY
from tests.support.slack import RecordingSlack

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
WINDOW_S = 6
EVALUATE_EVERY_S = 15
# the shortest silence the advance sweep takes for a dead run: three of the workers' 30 s beats
UNRESPONSIVE_AFTER_S = 90.0


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
        from loragate.flows.events import announce_training_completed

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
        replica = self.replicas[key]  # read with its key: keyless, /v1/models lists the base alone
        with ReplicaClient(replica.url, admin_key=(replica.secrets_dir / "admin-key").read_text()) as client:
            return client.served_adapters()

    def serves_version(self, key: str, name: str, version: str, path: str) -> bool:
        """Whether the replica answers ``name`` from ``path``: under the plain name, or -- where
        a move only sent users there -- the warm ``name@version`` with the plain name gone."""
        served = self.served(key)
        if name in served:
            return served[name] == path
        return served.get(f"{name}@{version}") == path

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


@pytest.fixture(scope="module", name="stack")
def stack_fixture(prefect_server, pg_template, replicas, replica_adapters, tiny_base, s3_endpoint, tmp_path_factory):
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
        # is a row of tests/test_canary_verdict.py's table
        "LORAGATE_CANARY_P95_SLACK_MS": "5000",
        # the canary opens its live split (1 %) on the production replicas, but no user sends
        # traffic here: the minimum of live requests is tests/test_live_verdict.py's (and
        # tests/test_live_canary.py's, with users)
        "LORAGATE_CANARY_MIN_LIVE_REQUESTS": "0",
        # nor the count a verdict needs to catch errors 2x production's (tests/test_undecided.py)
        "LORAGATE_CANARY_DETECT_RATIO": "0",
        "LORAGATE_APPROVAL_POLL_S": "1",
        "LORAGATE_UNRESPONSIVE_AFTER_S": str(UNRESPONSIVE_AFTER_S),
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
        point_replicas(replicas.values(), settings.database_url)  # as loragate_replica
        for replica in replicas.values():
            registry.add_replica(replica.url, "tiny-llama", replica.role, str(replica_adapters))
        # each gate acts with its own role's token, from its pool's secrets directory; people sign off
        # with their own activation tokens. No pool's role is admin: no worker can mint a token
        tokens = {
            role: registry.create_token(role.value, f"pipeline-{role.value}", pipeline=True)[1]
            for role in sorted({pool.role for pool in POOLS})
        }
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
    # the pools that switch replicas hold the replicas' admin key; no other does
    [secrets_dir] = {r.secrets_dir for r in replicas.values()}
    hand_admin_key(pipeline.secret_dirs, (secrets_dir / ADMIN_KEY_FILE).read_text())
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
    from loragate.registry.digests import sha256_file

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
