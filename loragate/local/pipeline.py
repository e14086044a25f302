"""The promotion pipeline on one machine: a local Prefect server, loragate's deployments
from ``prefect.yaml``, and a warm worker per work pool (``POOLS``; a process worker each for a peer) -- for
``make demo``, the end-to-end tests and ``bench/pipeline.py``.

``prefect deploy --all`` runs exactly as an operator would run it; only the two schedules
are then tightened (an evaluation every few seconds instead of every ten minutes), because
a demo canary window lasts seconds, not a day. The workers get the loragate settings as
environment variables, which every flow run they start inherits: settings never travel as
flow parameters. Credentials travel as neither: each pool's worker holds one role's token
(and the signing pool the signing key) in a secrets directory of its own, as a Kubernetes
Secret mounted into that pool's pods would (``tasks/credentials.py``) -- on Postgres with
its role's database URL (``loragate_<role>``, never the owner's).

A worker starts from an allowlisted environment (``worker_environment``), not its parent's:
the system's basics, the Prefect client's settings, the loragate settings it was given and
its own secrets directory's path -- no token, no other pool's directory, no owner's
database URL. On one host under one OS user that is all that separates the pools: their
secrets directories are 0700 but readable by that user, so code running on one worker can
read another's files. Production runs one pod per pool (``infra/k8s/``), where a pool's
Secret is mounted into its own pods only.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from loragate.local.prefect_local import (
    AUTH_FILE,
    HEARTBEAT_ENV,
    PrefectServer,
    kept_database_url,
    prefect_bin,
    start_local_prefect_server,
    start_prefect_server,
    start_worker,
    stop,
    stop_process,
)
from loragate.local.replica_config import replica_environment
from loragate.registry.db.users import role_database_url
from loragate.registry.rules.access import Role
from loragate.tasks.credentials import SECRETS_DIR_VARIABLE, write_pool_secrets
from loragate.tasks.secret_files import DATABASE_URL_FILE

ROOT = Path(__file__).resolve().parents[2]
# the local pipeline's reconcile and advance sweep (prefect.yaml: every 5 min and every minute)
SWEEPS_EVERY_S = 60.0


@dataclass(frozen=True)
class Pool:
    """A work pool and the one gate role its worker acts as."""

    name: str
    role: Role
    holds_signing_key: bool = False
    preload: tuple[str, ...] = ()  # modules its warm worker imports at start, before any run


# shadow validation's libraries: importing PEFT alone takes ~8 s here, torch and
# transformers' model classes most of the rest
VALIDATION_IMPORTS = ("torch", "peft", "transformers.models.auto.modeling_auto", "loragate.tasks.validation.runner")

# prefect.yaml puts each deployment on the pool of the role its gates need, and every pool
# runs where the imports are paid. The signing role has two pools: `gpu` validates and signs
# (the key is there and nowhere else), `canary` deploys what was validated with the signing
# token alone. A cluster runs each validation batch as a Kubernetes Job on a GPU node
# instead (infra/k8s/), which holds a GPU only while it validates.
POOLS = (
    Pool("intake", Role.TRAINING, preload=("great_expectations",)),  # a golden set's suite
    Pool("gpu", Role.SIGNING, holds_signing_key=True, preload=VALIDATION_IMPORTS),
    Pool("canary", Role.SIGNING),
    Pool("release", Role.ACTIVATION),
    # reconcile and the advance sweep: the fleet role drives replicas and can mint no token
    Pool("fleet", Role.FLEET),
)


@dataclass(frozen=True)
class PipelineSecrets:
    """What the pipeline's workers act with, split between them by ``write_secrets``."""

    tokens: dict[Role, str] = field(repr=False)
    signing_key_pem: bytes | None = field(default=None, repr=False)
    slack_token: str | None = field(default=None, repr=False)
    # each role's database URL (its loragate_<role> user, with its password); on Postgres a
    # role missing here connects as its user without a password (a server trusting local users)
    database_urls: dict[Role, str] = field(default_factory=dict, repr=False)


def write_secrets(directory: Path, secrets: PipelineSecrets, database_url: str | None = None) -> dict[str, Path]:
    """One secrets directory per pool under ``directory``: its role's token, the signing key
    for the signing pool only, the Slack token for every pool (each one notifies), and where
    ``database_url`` (the owner's) is Postgres, the URL of the pool's role's database user."""
    return {
        pool.name: write_pool_secrets(
            directory / pool.name,
            {pool.role: secrets.tokens[pool.role]} if pool.role in secrets.tokens else {},
            secrets.signing_key_pem if pool.holds_signing_key else None,
            secrets.slack_token,
            secrets.database_urls.get(pool.role)
            or (role_database_url(database_url, pool.role) if database_url else None),
        )
        for pool in POOLS
    }


# the loragate settings a worker takes from the caller's; the database URL it takes from its
# secrets directory where that holds one (Postgres), and a token never
_NOT_PASSED = frozenset({"LORAGATE_TOKEN", "LORAGATE_SLACK_TOKEN", SECRETS_DIR_VARIABLE})
# beyond a replica's allowlist: Great Expectations' analytics off (the intake pool) and the
# tokenizers' threads (shadow validation), named: their prefixes would admit a token
_WORKER_NAMES = ("GX_ANALYTICS_ENABLED", "TOKENIZERS_PARALLELISM")


def worker_environment(
    server: PrefectServer, loragate_env: dict[str, str], secrets_dir: Path, *, with_database_url: bool
) -> dict[str, str]:
    """All a pool's worker starts with: the system's basics and the ML libraries' knobs
    (``replica_environment``'s allowlist, secrets dropped), the Prefect client's settings
    (the API URL and its credential, which every worker needs), ``loragate_env`` without a
    token or -- when the secrets directory holds the pool's own -- the database URL, and the
    path of this pool's secrets directory."""
    passed = {
        name: value
        for name, value in loragate_env.items()
        if name not in _NOT_PASSED and (with_database_url or name != "LORAGATE_DATABASE_URL")
    }
    libraries = {name: os.environ[name] for name in _WORKER_NAMES if name in os.environ}
    return {
        **replica_environment(os.environ),
        **libraries,
        **server.env,
        **passed,
        # its flow runs beat every 30 s, so the advance sweep crashes one its death left
        # RUNNING after LORAGATE_UNRESPONSIVE_AFTER_S (tasks/unresponsive.py); on SQLite
        # (make demo) Prefect's default 180 s: a beat every 30 s of each run there took
        # the server's one writer (287 "database is locked" with the automation of an
        # earlier stop, a sign-off never started)
        **(HEARTBEAT_ENV if server.on_postgres else {}),
        SECRETS_DIR_VARIABLE: str(secrets_dir),
    }


@dataclass
class LocalPipeline:
    server: PrefectServer
    env: dict[str, str]  # what a `loragate` or `prefect` command needs to reach this pipeline
    workers: list[subprocess.Popen] = field(default_factory=list)
    owns_server: bool = True
    secret_dirs: dict[str, Path] = field(default_factory=dict)  # per pool

    def pool_env(self, pool: str) -> dict[str, str]:
        """What a process needs to run a flow as ``pool``'s worker would: ``env`` and that
        pool's secrets directory."""
        return {**self.env, SECRETS_DIR_VARIABLE: str(self.secret_dirs[pool])}

    def wait_for_workers(self, timeout_s: float = 300.0) -> float:
        """Wait until every pool has a worker online -- a warm one registers once its imports
        are done -- and return the seconds waited: a benchmark times the pipeline, not its
        start. Raises TimeoutError naming the pools without one."""
        import time

        from prefect.client.orchestration import get_client
        from prefect.settings import temporary_settings

        start = time.monotonic()
        waiting = [pool.name for pool in POOLS]
        with temporary_settings(self.server.client_settings()), get_client(sync_client=True) as client:
            while waiting:
                waiting = [
                    pool
                    for pool in waiting
                    if not any(w.status.value == "ONLINE" for w in client.read_workers_for_work_pool(pool))
                ]
                if waiting and time.monotonic() - start > timeout_s:
                    raise TimeoutError(f"no worker online after {timeout_s:.0f} s on pool(s) {', '.join(waiting)}")
                if waiting:
                    time.sleep(0.5)
        return time.monotonic() - start

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


def deploy(
    server: PrefectServer,
    env: dict[str, str],
    *,
    evaluate_every_s: float | None,
    reconcile_every_s: float | None,
    advance_every_s: float | None,
    watch_every_s: float | None = None,
) -> None:
    """Create the work pools, ``prefect deploy --all``, then set the four schedules."""
    for pool in POOLS:
        _prefect(server, env, "work-pool", "create", pool.name, "--type", "process", "--overwrite")
    _prefect(server, env, "deploy", "--all")
    set_interval(server, "canary-evaluate/canary-evaluate", evaluate_every_s)
    set_interval(server, "reconcile/reconcile", reconcile_every_s)
    set_interval(server, "advance/advance", advance_every_s)
    set_interval(server, "traffic-watch/traffic-watch", watch_every_s)


def set_interval(server: PrefectServer, deployment: str, seconds: float | None) -> None:
    """Run ``deployment`` every ``seconds``; ``None``: only when someone starts it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.schedules import IntervalSchedule
    from prefect.settings import temporary_settings

    with temporary_settings(server.client_settings()), get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        for schedule in client.read_deployment_schedules(found.id):
            client.delete_deployment_schedule(found.id, schedule.id)
        if seconds is not None:
            schedule = IntervalSchedule(interval=timedelta(seconds=seconds))
            client.create_deployment_schedules(found.id, [(schedule, True)])


def start_pipeline(
    home: Path,
    loragate_env: dict[str, str],
    secrets: PipelineSecrets,
    *,
    evaluate_every_s: float | None = 5.0,
    reconcile_every_s: float | None = SWEEPS_EVERY_S,
    advance_every_s: float | None = SWEEPS_EVERY_S,
    watch_every_s: float | None = None,
    server: PrefectServer | None = None,
    warm_workers: bool = True,
) -> LocalPipeline:
    """The local stack's Prefect server under ``home`` (or the one given), loragate deployed
    on it, and one worker per pool whose flow runs see ``loragate_env`` and act with that
    pool's share of ``secrets`` (written under ``<server home>/secrets/<pool>``). An
    ``*_every_s`` of ``None`` leaves that deployment to be started by hand;
    ``warm_workers=False`` gives every pool a process worker (a flow run per process:
    ``bench/pipeline.py``'s peer)."""
    owns_server = server is None
    server = server or start_local_prefect_server(home)
    pipeline = LocalPipeline(server, {**server.env, **loragate_env}, owns_server=owns_server)
    try:
        deploy(
            server,
            loragate_env,
            evaluate_every_s=evaluate_every_s,
            reconcile_every_s=reconcile_every_s,
            advance_every_s=advance_every_s,
            watch_every_s=watch_every_s,
        )
        pipeline.secret_dirs = write_secrets(
            server.home / "secrets", secrets, loragate_env.get("LORAGATE_DATABASE_URL")
        )
        for pool in POOLS:
            pipeline.workers.append(
                start_pool_worker(server, pool, loragate_env, pipeline.secret_dirs[pool.name], warm_workers)
            )
    except BaseException:
        pipeline.stop()
        raise
    return pipeline


def start_pool_worker(
    server: PrefectServer, pool: Pool, loragate_env: dict[str, str], secrets_dir: Path, warm: bool = True
) -> subprocess.Popen:
    """``pool``'s worker, started from ``worker_environment`` alone (nothing of this
    process's own environment beyond its allowlist)."""
    holds_url = (secrets_dir / DATABASE_URL_FILE).exists()
    env = worker_environment(server, loragate_env, secrets_dir, with_database_url=not holds_url)
    log = server.home / f"worker-{pool.name}.log"
    return start_worker(server, pool.name, env, cwd=ROOT, log=log, warm=warm, preload=pool.preload, inherit=False)


def reopen_ui(home: Path = Path(".loragate/prefect"), port: int = 4200) -> None:
    """``make ui``: the Prefect server on the demo's history, until Ctrl-C."""
    import time

    database_url = kept_database_url(home)
    if database_url is None and not (home / "prefect.db").exists():
        raise SystemExit(f"no Prefect history under {home}: run `make demo` first")
    server = start_prefect_server(home, port, database_url=database_url)
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
