"""The promotion pipeline on one machine: a local Prefect server, loragate's deployments
from ``prefect.yaml``, and a process worker per work pool -- for ``make demo``, the
end-to-end tests and ``bench/pipeline.py``.

``prefect deploy --all`` runs exactly as an operator would run it; only the two schedules
are then tightened (an evaluation every few seconds instead of every ten minutes), because
a demo canary window lasts seconds, not a day. The workers get the loragate settings as
environment variables, which every flow run they start inherits: settings never travel as
flow parameters, and tokens and keys never as either (``save_pipeline_secrets`` puts them
in Secret blocks).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from infra.prefect_local import (
    AUTH_FILE,
    PrefectServer,
    prefect_bin,
    start_prefect_server,
    start_worker,
    stop,
    stop_process,
)
from registry.rules.access import Role

ROOT = Path(__file__).resolve().parents[1]
POOLS = ("cpu", "gpu")


@dataclass
class LocalPipeline:
    server: PrefectServer
    env: dict[str, str]  # what a `loragate` or `prefect` command needs to reach this pipeline
    workers: list[subprocess.Popen] = field(default_factory=list)
    owns_server: bool = True

    def stop(self) -> None:
        for worker in self.workers:
            stop_process(worker)
        self.workers = []
        if self.owns_server:
            stop(self.server)


def _prefect(server: PrefectServer, env: dict[str, str], *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        [prefect_bin(), "--no-prompt", *args],
        cwd=ROOT,
        env={**os.environ, **env, **server.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        output = proc.stdout[-3000:] + proc.stderr[-3000:]
        raise RuntimeError(f"prefect {' '.join(args)} exited {proc.returncode}:\n{output}")
    return proc.stdout


def deploy(server: PrefectServer, env: dict[str, str], *, evaluate_every_s: float, reconcile_every_s: float) -> None:
    """Create the work pools, ``prefect deploy --all``, then tighten the two schedules."""
    for pool in POOLS:
        _prefect(server, env, "work-pool", "create", pool, "--type", "process", "--overwrite")
    _prefect(server, env, "deploy", "--all")
    set_interval(server, "canary-evaluate/canary-evaluate", evaluate_every_s)
    set_interval(server, "reconcile/reconcile", reconcile_every_s)


def set_interval(server: PrefectServer, deployment: str, seconds: float) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.settings import temporary_settings

    with temporary_settings(server.client_settings()), get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        for schedule in client.read_deployment_schedules(found.id):
            client.delete_deployment_schedule(found.id, schedule.id)
        client.create_deployment_schedules(found.id, [(IntervalSchedule(interval=timedelta(seconds=seconds)), True)])


def start_pipeline(
    home: Path,
    loragate_env: dict[str, str],
    *,
    evaluate_every_s: float = 5.0,
    reconcile_every_s: float = 60.0,
    server: PrefectServer | None = None,
) -> LocalPipeline:
    """A Prefect server under ``home`` (or the one given), loragate deployed on it, and one
    worker per pool whose flow runs see ``loragate_env``."""
    owns_server = server is None
    server = server or start_prefect_server(home)
    pipeline = LocalPipeline(server, {**server.env, **loragate_env}, owns_server=owns_server)
    try:
        deploy(server, loragate_env, evaluate_every_s=evaluate_every_s, reconcile_every_s=reconcile_every_s)
        for pool in POOLS:
            pipeline.workers.append(
                start_worker(server, pool, loragate_env, cwd=ROOT, log=server.home / f"worker-{pool}.log")
            )
    except BaseException:
        pipeline.stop()
        raise
    return pipeline


def reopen_ui(home: Path = Path(".loragate/prefect"), port: int = 4200) -> None:
    """``make ui``: the Prefect server on the demo's history, until Ctrl-C."""
    import time

    if not (home / "prefect.db").exists():
        raise SystemExit(f"no Prefect history under {home}: run `make demo` first")
    server = start_prefect_server(home, port)
    print(f"Prefect UI on the demo's history: {server.ui_url}  (Ctrl-C stops it)", flush=True)
    print(f"log in with the server's credential, kept in {server.home / AUTH_FILE}", flush=True)
    try:
        while server.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop(server)


if __name__ == "__main__":
    reopen_ui()


def save_pipeline_secrets(
    server: PrefectServer, tokens: dict[Role, str], signing_key_pem: bytes | None, slack_token: str | None = None
) -> None:
    """The gates' tokens, the signing key and the Slack token as Secret blocks on ``server``."""
    from prefect.settings import temporary_settings

    from tasks.credentials import store_pipeline_secrets

    with temporary_settings(server.client_settings()):
        store_pipeline_secrets(tokens, signing_key_pem, slack_token)
